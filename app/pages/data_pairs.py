"""The Data page's inspector for preference rows (DPO, SimPO, ORPO pairs; KTO's labelled answers): the prompt once,
then the answers side by side, each with the tokens its method scores highlighted as the row inspector highlights
them, and each answer's token counts. The views come from hone.core.api.inspect_preference_rows (through the helper
process, data_check.py), tokenized exactly as training tokenizes them."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QHBoxLayout, QTextBrowser, QVBoxLayout, QWidget

from hone.app.pages.data_views import highlight_html
from hone.app.theme import Palette
from hone.app.widgets.common import label
from hone.core.config import PREFERENCE_METHODS, UNPAIRED_METHODS

# What each answer's column is called, by its side in the row.
SIDE_TITLES = {
    "chosen": "Chosen answer",
    "rejected": "Rejected answer",
    "desirable": "Desirable answer (label true)",
    "undesirable": "Undesirable answer (label false)",
}
SIDE_TIPS = {
    "chosen": "The answer the fine-tune learns to prefer (the row's chosen field).",
    "rejected": "The answer the fine-tune learns to rank below the chosen one (the row's rejected field).",
    "desirable": "KTO raises the likelihood of answers labelled true (the row's label field).",
    "undesirable": "KTO lowers the likelihood of answers labelled false (the row's label field).",
}
# A one-line cell of the preview table holds at most this many characters of an answer (the tooltip has them all).
PREVIEW_CHARS = 200


def rows_kind(method: str) -> str:
    """How `method` reads its rows: "pairs" (DPO, SimPO, ORPO), "answers" (KTO's labelled answers) or "rows" (SFT,
    GRPO: hone.core.api.check_data)."""
    if method in PREFERENCE_METHODS:
        return "pairs"
    return "answers" if method in UNPAIRED_METHODS else "rows"


def is_preference_view(view: Any) -> bool:
    """Whether `view` is a preference row's view (hone.core.api.inspect_preference_rows), not a RowView."""
    return view is not None and hasattr(view, "answers")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def row_lines(view: Any) -> tuple[str, str]:
    """The preview table's prompt and response cells of a preference row: the prompt as rendered, and each answer
    after its side's name ("chosen: … | rejected: …")."""
    if not view.answers:
        return "", ""
    answers = " | ".join(f"{a.side}: {_one_line(a.answer_text)[:PREVIEW_CHARS]}" for a in view.answers)
    return _one_line(view.prompt_text), answers


def counts_text(answer: Any) -> str:
    """An answer's token counts: its sequence (prompt + answer), the prompt's share, and the tokens scored."""
    truncated = " · cut at the maximum length" if answer.truncated else ""
    return (
        f"{answer.num_tokens:,} tokens ({answer.prompt_tokens:,} prompt, "
        f"{answer.num_tokens - answer.prompt_tokens:,} answer) · {answer.num_trained:,} trained{truncated}"
    )


class AnswerColumn(QWidget):
    """One answer: its side's title, the answer with its trained tokens highlighted, its token counts."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.title = label("", "muted")
        self.text = QTextBrowser()
        self.text.setMinimumHeight(160)
        self.counts = label("", "muted", wrap=True, selectable=True)
        for widget in (self.title, self.text, self.counts):
            layout.addWidget(widget)

    def show_answer(self, answer: Any, own_prompt: bool, palette: Palette | None) -> None:
        """Show `answer`; `own_prompt`: its sequence renders the prompt unlike the first answer's, so the prompt it
        follows is shown above it too (muted, untrained)."""
        self.title.setText(SIDE_TITLES.get(answer.side, answer.side))
        self.title.setToolTip(SIDE_TIPS.get(answer.side, ""))
        pieces = (answer.prompt if own_prompt else []) + answer.answer
        self.text.setHtml(highlight_html(pieces, palette))
        self.counts.setText(counts_text(answer))


class PairInspector(QWidget):
    """The prompt once, and up to two answers side by side (a pair, or a paired row read for KTO)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.prompt_title = label("Prompt (context only: no token of it is trained)", "muted")
        self.prompt = QTextBrowser()
        self.prompt.setMinimumHeight(80)
        self.prompt.setMaximumHeight(200)
        layout.addWidget(self.prompt_title)
        layout.addWidget(self.prompt)
        sides = QHBoxLayout()
        self.columns = [AnswerColumn(), AnswerColumn()]
        for column in self.columns:
            sides.addWidget(column, 1)
        layout.addLayout(sides, 1)

    def show_view(self, view: Any, palette: Palette | None) -> str:
        """Show a PreferenceView (one the check kept); returns the inspector's title line for it."""
        first = view.answers[0]
        self.prompt.setHtml(highlight_html(first.prompt, palette))
        for k, column in enumerate(self.columns):
            column.setVisible(k < len(view.answers))
            if k < len(view.answers):
                answer = view.answers[k]
                column.show_answer(answer, k > 0 and answer.prompt_text != first.prompt_text, palette)
        share = view.num_trained / view.num_tokens if view.num_tokens else 0
        sides = " and ".join(a.side for a in view.answers)
        return (
            f"{view.source} · {view.format} · {sides} · {view.num_tokens:,} tokens, "
            f"{view.num_trained:,} trained ({share:.0%})"
        )

    def clear(self) -> None:
        self.prompt.clear()
        for column in self.columns:
            column.text.clear()
            column.counts.setText("")

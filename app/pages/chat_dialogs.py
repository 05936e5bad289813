"""The Chat page's evaluation results: scores of both models on held-out rows (EvaluationDialog) or, for a
preference run, on held-out pairs (PreferenceDialog)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from hone.app.widgets.common import label
from hone.core.api import BASE, TUNED


def preference_summary(scores) -> str:
    """One line for a preference evaluation: how often each model ranks the chosen answer first."""
    return (
        f"the fine-tune ranks the chosen answer first in {scores.tuned_right} of {scores.pairs} held-out pairs "
        f"({scores.accuracy(True):.0%}), the base in {scores.base_right} ({scores.accuracy(False):.0%})"
    )


class PreferenceDialog(QDialog):
    """A preference run's evaluation: per model, how often it ranks each held-out pair's chosen answer above the
    rejected one, and by how much; with the fine-tune's implicit reward (its gain over the base, chosen against
    rejected)."""

    ROWS = ("Preference accuracy", "Mean margin (log-prob per token)")

    def __init__(self, title: str, scores, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        layout = QVBoxLayout(self)
        summary = preference_summary(scores)
        self.summary = label(summary[0].upper() + summary[1:] + ".", wrap=True, selectable=True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(len(self.ROWS) + 1, 2)
        self.table.setHorizontalHeaderLabels(("Base", "Fine-tuned"))
        self.table.setVerticalHeaderLabels((*self.ROWS, "Reward ranks chosen first"))
        cells = (
            (f"{scores.accuracy(False):.1%}", f"{scores.accuracy(True):.1%}"),
            (f"{scores.base_margin:+.3f}", f"{scores.tuned_margin:+.3f}"),
            ("—", f"{scores.reward_right / max(scores.pairs, 1):.1%}"),
        )
        for r, row in enumerate(cells):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setFlags(item.flags() & ~Qt.ItemIsEditable)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        layout.addWidget(self.table, 1)


class EvaluationDialog(QDialog):
    """The scores of an evaluation and every prompt's answers, base beside fine-tune (✓ = the reference exactly)."""

    COLUMNS = ("Row", "Question", "Reference", "Base", "Fine-tuned")

    def __init__(self, title: str, comparison, skipped: list[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.resize(1100, 560)
        layout = QVBoxLayout(self)
        summary = comparison.summary() + (f"; {len(skipped)} rows of the file could not be read" if skipped else "")
        self.summary = label(summary[0].upper() + summary[1:] + ".", wrap=True, selectable=True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(len(comparison.answered), len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(self.COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(True)
        for r, answered in enumerate(comparison.answered):
            cells = (
                str(answered.row),
                answered.question,
                answered.reference,
                _scored(answered.base, answered.exact(BASE), answered.f1(BASE)),
                _scored(answered.tuned, answered.exact(TUNED), answered.f1(TUNED)),
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setFlags(item.flags() & ~Qt.ItemIsEditable)
                self.table.setItem(r, c, item)
        self.table.resizeColumnToContents(0)
        for c in range(1, len(self.COLUMNS)):
            self.table.setColumnWidth(c, 250)
        self.table.resizeRowsToContents()
        layout.addWidget(self.table, 1)


def _scored(answer: str, exact: bool, f1: float) -> str:
    return f"{'✓' if exact else '✗'} F1 {f1:.2f}\n{answer}"

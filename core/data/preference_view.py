"""The inspector for preference rows: a pair's prompt and its two answers, or KTO's labelled answer, tokenized exactly
as training tokenizes them, with the scored tokens marked; and the Data page's check of such data.

Each answer is encoded as the training data is (hone.core.data.preference.PairEncoder: the prompt followed by the
answer through the SFT encoder, only the answer's tokens scored) and cut into `Piece`s as the SFT inspector cuts a
row (hone.core.data.inspect), split where the answer starts so that a page can show the prompt once and the answers
side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hone.core.config import UNPAIRED_METHODS
from hone.core.data.formats import ColumnNames
from hone.core.data.inspect import Piece, _pieces, render_pieces, token_line, views_of_rows
from hone.core.data.labels import Encoded
from hone.core.data.loaders import read_records
from hone.core.data.preference import PairEncoder, PairSet, check_pairs, normalize_pair
from hone.core.data.preference import _build as _build_pairs
from hone.core.data.preference import read_split as read_pairs
from hone.core.data.rows import RowError, RowProblem
from hone.core.data.unpaired import UnpairedSet, _encoder, check_unpaired, normalize_unpaired
from hone.core.data.unpaired import _build as _build_unpaired
from hone.core.data.unpaired import read_split as read_unpaired
from hone.core.events import DatasetReport


@dataclass(frozen=True)
class AnswerView:
    """One answer as training sees it: the prompt followed by the answer, one sequence.

    Attributes:
        side: "chosen" or "rejected" (a pair), "desirable" or "undesirable" (KTO).
        prompt: the pieces before the answer (none trained): the prompt as this sequence renders it.
        answer: the pieces from the answer's first token on; the trained ones are what the method scores.
        token_ids: the sequence's token ids; trained: per token, whether it is scored.
        truncated: data.max_length cut the sequence.
        problem: why training skips this answer (then the other fields are empty).
    """

    side: str
    prompt: list[Piece] = field(default_factory=list)
    answer: list[Piece] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    truncated: bool = False
    problem: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.trained)

    @property
    def prompt_tokens(self) -> int:
        return sum(p.tokens for p in self.prompt)

    @property
    def prompt_text(self) -> str:
        return "".join(p.text for p in self.prompt)

    @property
    def answer_text(self) -> str:
        return "".join(p.text for p in self.answer)


@dataclass
class PreferenceView:
    """What the inspector shows for one preference row: its answers (chosen and rejected, or KTO's labelled ones),
    each with the prompt it follows. `problem`: the row is skipped as a whole (then `answers` is empty)."""

    source: str
    format: str = ""
    answers: list[AnswerView] = field(default_factory=list)
    problem: str | None = None
    images: list[Any] = field(default_factory=list)  # preference rows are text; here for the row views' shape

    @property
    def prompt_text(self) -> str:
        """The prompt as the first answer's sequence renders it."""
        return self.answers[0].prompt_text if self.answers else ""

    @property
    def num_tokens(self) -> int:
        return sum(a.num_tokens for a in self.answers)

    @property
    def num_trained(self) -> int:
        return sum(a.num_trained for a in self.answers)


def _answer_view(encoder: PairEncoder, side: str, prompt, answer, source: str, fmt: str) -> AnswerView:
    """One answer encoded as PairEncoder.encode encodes it, cut into pieces at the answer's first token."""
    try:
        row, start = encoder.answer_row(prompt, answer, source, fmt)
    except Exception as e:  # the template raised: the row's problem, as in training
        problem = RowProblem(source, "chat template error", "", f"the chat template failed: {e}")
        return AnswerView(side, problem=problem.message)
    (encoded,) = encoder.encoder.encode([row], keep_text=True)
    result = encoder.answer_only(encoded, start)
    if isinstance(result, RowProblem):
        return AnswerView(side, problem=result.message)
    assert isinstance(result, Encoded) and result.offsets is not None
    pieces, _ = _pieces(result, encoder.encoder)
    split = int(np.sum(result.offsets < start))  # tokens that start before the answer: none of them is scored
    before = [p for p in pieces if p.first_token + p.tokens <= split]
    after = [p for p in pieces if p.first_token >= split]
    straddling = [p for p in pieces if p.first_token < split < p.first_token + p.tokens]
    if straddling:  # a run of unscored tokens crossing into the answer: cut it at the answer's first token
        piece = straddling[0]
        cut = int(result.offsets[split]) - int(result.offsets[piece.first_token])
        head = Piece(piece.text[:cut], piece.trained, split - piece.first_token, piece.kind, piece.first_token)
        tail = Piece(piece.text[cut:], piece.trained, piece.tokens - head.tokens, piece.kind, split)
        before, after = [*before, head], [tail, *after]
    return AnswerView(
        side, before, after, result.ids.tolist(), result.trained.tolist(), truncated=bool(result.truncated)
    )


def _view(record: Any, source: str, columns: ColumnNames, encoder: PairEncoder, unpaired: bool) -> PreferenceView:
    if isinstance(record, RowProblem):
        return PreferenceView(source, problem=record.message)
    try:
        if unpaired:
            rows = normalize_unpaired(record, columns, source)
            answers = [
                _answer_view(
                    encoder, "desirable" if r.desirable else "undesirable", r.prompt, r.completion, source, r.format
                )
                for r in rows
            ]
            return PreferenceView(source, rows[0].format, answers)
        pair = normalize_pair(record, columns, source)
    except RowError as e:
        return PreferenceView(source, problem=RowProblem(source, e.reason, e.field, e.detail).message)
    answers = [
        _answer_view(encoder, side, pair.prompt, answer, source, pair.format)
        for side, answer in (("chosen", pair.chosen), ("rejected", pair.rejected))
    ]
    problem = next((a.problem for a in answers if a.problem), None)  # training skips the pair for either side
    return PreferenceView(source, pair.format, [] if problem else answers, problem)


def inspect_preference_rows(entry: str, tokenizer, rows: list[int], *, cfg=None, method: str = "dpo"):
    """Views of the given rows (1-based, as the report numbers them) of one preference data source.

    Args:
        entry: a file, folder or dataset id holding one source.
        tokenizer: the model's tokenizer.
        rows: row numbers.
        cfg: a DataConfig (columns, max_length, overlong; default: DataConfig()).
        method: the training method: "kto" reads labelled answers (a paired row gives both, labelled), the other
            preference methods read pairs.

    Returns:
        list[PreferenceView], in the order of `rows`.

    Raises:
        DataError: the source cannot be read, holds several files, or a requested row does not exist.
    """
    if cfg is None:
        from hone.core.config import DataConfig

        cfg = DataConfig()
    encoder, columns, unpaired = _encoder(cfg, tokenizer), ColumnNames(cfg.columns), method in UNPAIRED_METHODS
    return views_of_rows(
        entry,
        rows,
        read_records,
        lambda source, number, record: _view(record, f"{source.name}:{number}", columns, encoder, unpaired),
    )


def format_preference_view(view: PreferenceView, color: bool = True, show_tokens: bool = False) -> str:
    """The view as terminal text: the prompt (once, where every answer's sequence renders it alike), then each answer
    under its side with the tokens the method scores in green (or [[...]] without color), then the row's counts."""
    if view.problem:
        return f"skipped: {view.problem}"
    shared = len({a.prompt_text for a in view.answers}) == 1
    lines = [render_pieces(view.answers[0].prompt, color), ""] if shared else []
    for answer in view.answers:
        facts = f"{answer.num_tokens} tokens, {answer.num_trained} scored" + (
            ", truncated to max_length" if answer.truncated else ""
        )
        lines.append(f"── {answer.side} ({facts})")
        if not shared:
            lines.append(render_pieces(answer.prompt, color))
        lines += [render_pieces(answer.answer, color), ""]
        if show_tokens:
            lines.insert(-1, token_line(answer.token_ids, answer.trained))
    lines.append(
        f"{view.source}: {view.format}, {len(view.answers)} answer{'s' if len(view.answers) != 1 else ''}, "
        f"{view.num_tokens} tokens, {view.num_trained} scored"
    )
    return "\n".join(lines)


def check_preference(
    cfg, tokenizer=None, *, split: str = "train", method: str = "dpo", weights: tuple[float, float] = (1.0, 1.0)
) -> tuple[DatasetReport, PairSet | UnpairedSet | None]:
    """The report of one split's preference rows, every skipped row listed, and with a tokenizer their tokenized
    set (pairs, or KTO's labelled answers, as training reads them); without, only read and checked (None).
    `weights` (desirable, undesirable) are what KTO's balance note judges."""
    unpaired = method in UNPAIRED_METHODS
    if tokenizer is None:
        report = check_unpaired(cfg, split=split, weights=weights) if unpaired else check_pairs(cfg, split=split)
        return report, None
    entries = cfg.train if split == "train" else cfg.eval
    if unpaired:
        rows, builder = read_unpaired(entries, split, cfg, _encoder(cfg, tokenizer), max_examples=None)
        return _build_unpaired(builder, rows, weights), rows
    pairs, builder, _ = read_pairs(entries, split, cfg, _encoder(cfg, tokenizer), max_examples=None)
    return _build_pairs(builder, pairs), pairs

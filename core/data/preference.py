"""Preference data: rows of a prompt with a chosen and a rejected answer, read, checked and tokenized as pairs.

Row shapes (column names as `data.columns` maps them):
- plain text: {"prompt": str, "chosen": str, "rejected": str}; each answer is scored as it follows the prompt, with
  the end-of-text token appended;
- conversational: {"prompt": [messages], "chosen": [messages], "rejected": [messages]}, rendered through the chat
  template, or {"chosen": [messages], "rejected": [messages]} with the prompt found as their shared first messages
  (a "prompt" string equal to the first user turn, as UltraFeedback-binarized writes it, is the same prompt);
- plain text with the prompt inside both answers ({"chosen": str, "rejected": str}, HH-RLHF's shape): the prompt is
  their shared start, up to the last turn marker when it has one.

Each pair becomes two sequences, the prompt followed by each answer, in which only the answer's tokens are scored.
They are encoded by the SFT encoder (`RowEncoder`, with its limits and checks), then everything before the answer is
unmarked. A pair is skipped, with the row and field named, when its answers are identical or empty, when an answer is
not the right type, or when the prompt leaves no answer token within data.max_length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hone.core.data.formats import ColumnNames, _kind, _turns
from hone.core.data.holdout import hold_out_rows
from hone.core.data.labels import Encoded, RowEncoder
from hone.core.data.loaders import Source, SourceError, read_records, resolve_sources
from hone.core.data.report import MAX_EXAMPLES, ReportBuilder
from hone.core.data.rows import (
    EMPTY_CONTENT,
    MISSING_FIELD,
    NO_TRAINED_TOKENS,
    WRONG_TYPE,
    ImageRef,
    Row,
    RowError,
    RowProblem,
)
from hone.core.data.text_only import refuse_images
from hone.core.data.tokenized import TokenizedRow, TokenizedSet, TokenizedSetBuilder
from hone.core.errors import DataError
from hone.core.events import DatasetReport

# The columns a preference row is read from (their names as data.columns maps them).
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
IDENTICAL_ANSWERS = "identical answers"
PROMPT_TOO_LONG = "prompt longer than max_length"
# Pairs encoded per batch (two sequences each), as the SFT pipeline batches its rows.
ENCODE_PAIRS = 256
# Turn markers of plain-text dialogues (HH-RLHF): a shared start is cut back to the last one, so the answers begin
# with the assistant's turn.
TEXT_TURN_MARKERS = ("\n\nAssistant:", "\nAssistant:", "\n\nassistant:")


@dataclass
class PreferencePair:
    """One usable pair: `prompt` and both answers as messages (conversational) or strings (plain text)."""

    source: str
    prompt: list[dict[str, Any]] | str
    chosen: list[dict[str, Any]] | str
    rejected: list[dict[str, Any]] | str
    format: str


def _side(record: dict, columns: ColumnNames, canonical: str) -> list[dict[str, Any]] | str:
    name = columns[canonical]
    if name not in record:
        raise RowError(MISSING_FIELD, name, "is missing (a preference row has chosen and rejected answers)")
    value = record[name]
    if isinstance(value, str):
        if not value.strip():
            raise RowError(EMPTY_CONTENT, name, "is empty")
        return value
    if isinstance(value, list):
        return _turns(value, name, columns)[0]
    raise RowError(WRONG_TYPE, name, f"is {_kind(value)}, expected a string or a list of messages")


def _shared_messages(chosen: list, rejected: list) -> int:
    """How many first messages the two conversations share, leaving each at least its last message."""
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    return n


def _shared_text(chosen: str, rejected: str) -> int:
    """Where the answers of a plain-text pair start: their shared start, cut back to the last turn marker in it."""
    shared = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    ends = [chosen.rfind(marker, 0, shared) + len(marker) for marker in TEXT_TURN_MARKERS if marker in chosen[:shared]]
    return max(ends) if ends else shared


def normalize_pair(record: Any, columns: ColumnNames, source: str) -> PreferencePair:
    """One raw record as a PreferencePair.

    Raises:
        RowError: the row cannot be used; reason, field and detail say why.
    """
    if not isinstance(record, dict):
        raise RowError(WRONG_TYPE, "", f"is {_kind(record)}, expected an object with chosen and rejected")
    chosen, rejected = _side(record, columns, "chosen"), _side(record, columns, "rejected")
    refuse_images(record, columns, {"chosen": chosen, "rejected": rejected})
    prompt: Any = record.get(columns["prompt"])
    if isinstance(chosen, list) and isinstance(rejected, list):
        given_prompt = isinstance(prompt, list)
        prompt, chosen, rejected, fmt = _conversational(prompt, chosen, rejected, columns)
        if given_prompt:
            refuse_images(record, columns, {"prompt": prompt})
    elif isinstance(chosen, str) and isinstance(rejected, str):
        prompt, chosen, rejected, fmt = _plain_text(prompt, chosen, rejected, columns)
    else:
        raise RowError(
            WRONG_TYPE, columns["rejected"], f"is {_kind(rejected)} while {columns['chosen']} is {_kind(chosen)}"
        )
    if chosen == rejected:
        raise RowError(IDENTICAL_ANSWERS, columns["rejected"], "is the same as the chosen answer: nothing to prefer")
    return PreferencePair(source, prompt, chosen, rejected, fmt)


def _conversational(prompt: Any, chosen: list, rejected: list, columns: ColumnNames):
    if isinstance(prompt, list):
        prompt = _turns(prompt, columns["prompt"], columns)[0]
        shared, fmt = 0, "preference (messages)"
    elif prompt is None or isinstance(prompt, str):
        # The prompt is the answers' shared first messages (a prompt string beside them, as UltraFeedback-binarized
        # writes it, repeats their first user turn).
        shared, fmt = _shared_messages(chosen, rejected), "preference (messages, shared prompt)"
        if shared == 0:
            raise RowError(
                MISSING_FIELD,
                columns["prompt"],
                "is not given as messages and the answers share no first messages to take it from: give the "
                "prompt as a list of messages, or start both answers with the same prompt messages",
            )
        prompt = chosen[:shared]
    else:
        raise RowError(WRONG_TYPE, columns["prompt"], f"is {_kind(prompt)}, expected a list of messages")
    chosen, rejected = chosen[shared:], rejected[shared:]
    for side, name in ((chosen, "chosen"), (rejected, "rejected")):
        if not any(m["role"] == "assistant" for m in side):
            raise RowError(EMPTY_CONTENT, columns[name], "has no assistant turn after the prompt")
    return prompt, chosen, rejected, fmt


def _plain_text(prompt: Any, chosen: str, rejected: str, columns: ColumnNames):
    if prompt is None:
        start = _shared_text(chosen, rejected)
        if start == 0:
            raise RowError(
                MISSING_FIELD, columns["prompt"], "is missing and the answers share no start to take it from"
            )
        return chosen[:start], chosen[start:], rejected[start:], "preference (text, shared prompt)"
    if not isinstance(prompt, str):
        raise RowError(WRONG_TYPE, columns["prompt"], f"is {_kind(prompt)} while the answers are strings")
    if not prompt.strip():
        raise RowError(EMPTY_CONTENT, columns["prompt"], "is empty")
    return prompt, chosen, rejected, "preference (text)"


@dataclass
class PairRow:
    """One pair for the trainer: its two sequences (prompt + chosen, prompt + rejected), scored on the answers.
    `input_ids`, `labels` and `images` describe both end to end (what packing and memory planning read); the
    collation takes `sequences`, so the two stay separate sequences in one micro-batch."""

    sequences: tuple[TokenizedRow, TokenizedRow]
    source: str
    images: list[ImageRef] = field(default_factory=list)

    @property
    def input_ids(self) -> list[int]:
        return self.sequences[0].input_ids + self.sequences[1].input_ids

    @property
    def labels(self) -> list[int]:
        return self.sequences[0].labels + self.sequences[1].labels


class PairSet(Sequence[PairRow]):
    """Pairs over a TokenizedSet of their sequences (pair k = sequences 2k and 2k + 1).

    Attributes:
        lengths, trained_lengths: int64 [pairs], tokens and scored tokens of both sequences; num_tokens, num_trained.
    """

    def __init__(self, sequences: TokenizedSet):
        if len(sequences) % 2:
            raise ValueError("a pair set holds an even number of sequences")
        self.sequences = sequences
        self.lengths = sequences.lengths[0::2] + sequences.lengths[1::2]
        self.trained_lengths = sequences.trained_lengths[0::2] + sequences.trained_lengths[1::2]
        self.num_tokens, self.num_trained = int(self.lengths.sum()), int(self.trained_lengths.sum())
        self.image_rows = 0

    def __len__(self) -> int:
        return len(self.sequences) // 2

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"pair {index} of a set of {len(self)}")
        chosen, rejected = self.sequences[2 * index], self.sequences[2 * index + 1]
        return PairRow((chosen, rejected), chosen.source)

    def source(self, index: int) -> str:
        return self.sequences.source(2 * index)

    def subset(self, indices) -> PairSet:
        pairs = np.asarray(indices, dtype=np.int64)
        return PairSet(self.sequences.subset(np.stack([2 * pairs, 2 * pairs + 1], axis=1).reshape(-1)))


class PairEncoder:
    """Encodes pairs with the SFT encoder, scoring only the answers."""

    def __init__(self, encoder: RowEncoder):
        self.encoder = encoder

    def answer_row(self, prompt: list | str, answer: list | str, source: str, fmt: str) -> tuple[Row, int]:
        """The prompt followed by one answer as a Row, and where the answer starts (a character of its render)."""
        if isinstance(prompt, str):
            assert isinstance(answer, str)
            return Row(source, text=prompt + answer, format=fmt), len(prompt)
        assert isinstance(answer, list)
        messages = prompt + answer
        _, spans = self.encoder.template.render_with_spans(messages)
        prompt_turns = sum(1 for m in prompt if m["role"] == "assistant")
        return Row(source, messages=messages, format=fmt), spans[prompt_turns][0]

    def _rows(self, pair: PreferencePair) -> tuple[Row, Row, int, int]:
        """The two sequences as Rows, and where each answer starts (a character of its render)."""
        chosen, chosen_start = self.answer_row(pair.prompt, pair.chosen, pair.source, pair.format)
        rejected, rejected_start = self.answer_row(pair.prompt, pair.rejected, pair.source, pair.format)
        return chosen, rejected, chosen_start, rejected_start

    def encode(self, pairs: list[PreferencePair]) -> list[tuple[Encoded, Encoded] | RowProblem]:
        """Each pair as its two encoded sequences (answers scored only), or the RowProblem that skips it."""
        out: list[tuple[Encoded, Encoded] | RowProblem | None] = [None] * len(pairs)
        rows: list[Row] = []
        starts: list[int] = []
        placed: list[int] = []
        for k, pair in enumerate(pairs):
            try:
                chosen, rejected, chosen_start, rejected_start = self._rows(pair)
            except Exception as e:  # the template raised: the row's problem, never the run's
                out[k] = RowProblem(pair.source, "chat template error", "", f"the chat template failed: {e}")
                continue
            rows += [chosen, rejected]
            starts += [chosen_start, rejected_start]
            placed.append(k)
        encoded = self.encoder.encode(rows, keep_text=True)
        for j, k in enumerate(placed):
            first = self.answer_only(encoded[2 * j], starts[2 * j])
            second = self.answer_only(encoded[2 * j + 1], starts[2 * j + 1])
            if isinstance(first, RowProblem):
                out[k] = first
            elif isinstance(second, RowProblem):
                out[k] = second
            else:
                out[k] = (first, second)
        return out  # type: ignore[return-value]

    def answer_only(self, result: Encoded | RowProblem, answer_start: int) -> Encoded | RowProblem:
        """`result` with only the tokens from `answer_start` (a character of its render) on trained, or the problem
        that skips it when none is left."""
        if isinstance(result, RowProblem):
            return result
        assert result.offsets is not None
        result.trained = result.trained & (result.offsets >= answer_start)
        if not result.trained.any():
            return RowProblem(
                result.source,
                PROMPT_TOO_LONG if result.truncated else NO_TRAINED_TOKENS,
                "prompt" if result.truncated else "",
                f"the prompt fills data.max_length = {self.encoder.max_length} tokens, so no answer token is left to "
                "compare; raise data.max_length or shorten the prompt"
                if result.truncated
                else "the answer renders as no token",
            )
        return result


def _pairs(source: Source, columns: ColumnNames, report: ReportBuilder) -> Iterator[PreferencePair]:
    """Every usable pair of one source; every other row reported as skipped."""
    for number, record in read_records(source):
        report.read()
        if isinstance(record, RowProblem):
            report.skip(record)
            continue
        row_source = f"{source.name}:{number}"
        try:
            yield normalize_pair(record, columns, row_source)
        except RowError as e:
            report.skip(RowProblem(row_source, e.reason, e.field, e.detail))


def _batches(entries: list[str], split: str, cfg, report: ReportBuilder) -> Iterator[list[PreferencePair]]:
    try:
        sources = resolve_sources(entries, side=split)
    except SourceError as e:
        report.problem(e.message)
        return
    columns = ColumnNames(cfg.columns)
    batch: list[PreferencePair] = []
    for source in sources:
        try:
            for pair in _pairs(source, columns, report):
                batch.append(pair)
                if len(batch) == ENCODE_PAIRS:
                    yield batch
                    batch = []
        except SourceError as e:
            report.problem(e.message)
    if batch:
        yield batch


def read_split(
    entries: list[str], split: str, cfg, encoder: PairEncoder, max_examples: int | None = MAX_EXAMPLES
) -> tuple[PairSet, ReportBuilder, int]:
    """One split's pairs, its report (listing up to `max_examples` skipped rows; None: all) and how many pairs
    truncation shortened."""
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=max_examples)
    builder = TokenizedSetBuilder()
    truncated = 0
    for batch in _batches(entries, split, cfg, report):
        for pair, result in zip(batch, encoder.encode(batch), strict=True):
            if isinstance(result, RowProblem):
                report.skip(result)
                continue
            for side in result:
                builder.add(side.ids, side.trained, side.source)
            truncated += int(result[0].truncated or result[1].truncated)
            report.formats[pair.format] += 1
    report.truncated = truncated
    return PairSet(builder.build()), report, truncated


@dataclass
class PreferenceData:
    """What the trainer gets for a preference run: the training and evaluation pairs, one report per split."""

    train: PairSet
    eval: PairSet | None
    reports: list[DatasetReport]


def _build(report: ReportBuilder, pairs: PairSet, held_out: int = 0) -> DatasetReport:
    return report.build(pairs.lengths, pairs.trained_lengths, 0, held_out=held_out)


def _nothing_usable(what: str, entries: list[str], report: ReportBuilder) -> DataError:
    names = ", ".join(map(str, entries)) or "(none given)"
    if report.problems:
        reason = report.problems[0]
    elif report.rows_read == 0:
        reason = "the sources hold no rows"
    else:
        counts = ", ".join(f"{count} {reason}" for reason, count in report.skipped.most_common(3))
        first = report.examples[0] if report.examples else ""
        reason = f"none of the {report.rows_read:,} rows is a usable pair ({counts}); first: {first}"
    return DataError(
        f"no usable {what} pairs in {names}: {reason}",
        "a preference row has chosen and rejected answers (and a prompt): run `hone data check FILE --model MODEL "
        "--method dpo` for the full report",
    )


def load_preference_data(cfg, tokenizer, *, seed: int = 0) -> PreferenceData:
    """The training (and evaluation) pairs `cfg` (a DataConfig) names.

    Raises:
        DataError: no usable pair in a split.
    """
    encoder = PairEncoder(RowEncoder(tokenizer, max_length=cfg.max_length, overlong=cfg.overlong, train_on="assistant"))
    train, train_report, _ = read_split(cfg.train, "train", cfg, encoder)
    if len(train) == 0:
        raise _nothing_usable("training", cfg.train, train_report)
    if cfg.eval:
        eval_set, eval_report, _ = read_split(cfg.eval, "eval", cfg, encoder)
        if len(eval_set) == 0:
            raise _nothing_usable("evaluation", cfg.eval, eval_report)
        return PreferenceData(train, eval_set, [_build(train_report, train), _build(eval_report, eval_set)])
    if cfg.eval_fraction > 0 and len(train) >= 2:
        held = hold_out_rows(len(train), cfg.eval_fraction, seed, train_report, unit="pairs")
        eval_set, train = train.subset(held.eval_rows), train.subset(held.train_rows)
        reports = [_build(train_report, train, held_out=len(held.eval_rows)), _build(held.report, eval_set)]
        return PreferenceData(train, eval_set, reports)
    return PreferenceData(train, None, [_build(train_report, train)])


def check_pairs(cfg, tokenizer=None, *, split: str = "train") -> DatasetReport:
    """The report of one split's pairs, every skipped row listed: with a tokenizer each pair is tokenized too (its
    tokens and answer tokens counted); without, only read and checked (`hone data check --method dpo`)."""
    entries = cfg.train if split == "train" else cfg.eval
    if tokenizer is not None:
        encoder = PairEncoder(
            RowEncoder(tokenizer, max_length=cfg.max_length, overlong=cfg.overlong, train_on="assistant")
        )
        pairs, report, _ = read_split(entries, split, cfg, encoder, max_examples=None)
        return _build(report, pairs)
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=None)
    kept = 0
    for batch in _batches(entries, split, cfg, report):
        kept += len(batch)
        report.formats.update(pair.format for pair in batch)
    empty = np.zeros(0, np.int64)
    return report.build(empty, empty, 0, rows_kept=kept)

"""Unpaired preference data (KTO): a prompt and one answer labelled desirable or undesirable, read, checked and
tokenized.

Row shapes (column names as `data.columns` maps them; the label column is "label"):
- {"prompt": str, "completion": str, "label": true|false}, and the same with "prompt" and "completion" as lists of
  messages (TRL's unpaired preference shape), rendered through the chat template;
- any paired row that hone.core.data.preference reads gives two rows: its chosen answer desirable, its rejected one
  undesirable (as TRL unpairs paired data for its KTO trainer).

Each row becomes one sequence, the prompt followed by the answer, in which only the answer's tokens are scored (the
pair encoder's rules: hone.core.data.preference.PairEncoder). A row is skipped, with its row and field named, when
the label is missing or not a boolean, the answer is empty or not the prompt's type, or the prompt leaves no answer
token within data.max_length. Labels far from balanced get a note in the data report saying which weight to set.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hone.core.data.formats import ColumnNames, _kind, _turns
from hone.core.data.holdout import hold_out_rows
from hone.core.data.labels import RowEncoder
from hone.core.data.loaders import Source, SourceError, read_records, resolve_sources
from hone.core.data.preference import ENCODE_PAIRS, PairEncoder, normalize_pair
from hone.core.data.report import MAX_EXAMPLES, ReportBuilder
from hone.core.data.rows import EMPTY_CONTENT, MISSING_FIELD, WRONG_TYPE, RowError, RowProblem
from hone.core.data.text_only import refuse_images
from hone.core.data.tokenized import TokenizedRow, TokenizedSet, TokenizedSetBuilder
from hone.core.errors import DataError
from hone.core.events import DatasetReport

LABEL_COLUMN = "label"
# Below this share of either label the KL reference point and the weights rest on few rows: the report says so.
MIN_LABEL_SHARE = 0.10
# KTO's paper (Ethayarajh et al., eq. 8) keeps desirable_weight·desirable / (undesirable_weight·undesirable) within
# [1, 4/3]; TRL warns outside it. The report gives the range for the weight of the fewer label.
WEIGHT_RATIO_RANGE = (1.0, 4 / 3)


@dataclass
class UnpairedAnswer:
    """One usable row: `prompt` and `completion` as messages (conversational) or strings, and its label."""

    source: str
    prompt: list[dict[str, Any]] | str
    completion: list[dict[str, Any]] | str
    desirable: bool
    format: str


@dataclass
class LabeledRow(TokenizedRow):
    """A tokenized row with its KTO label, which the collators carry into the batch (`desirable`)."""

    desirable: bool = False


def _label(record: dict, columns: ColumnNames) -> bool:
    name = columns[LABEL_COLUMN]
    if name not in record:
        raise RowError(MISSING_FIELD, name, "is missing (a KTO row labels its completion true: desirable, or false)")
    value = record[name]
    if not isinstance(value, (bool, np.bool_)):
        raise RowError(WRONG_TYPE, name, f"is {_kind(value)}, expected true (desirable) or false (undesirable)")
    return bool(value)


def _completion(record: dict, columns: ColumnNames) -> list[dict[str, Any]] | str:
    name = columns["completion"]
    if name not in record:
        raise RowError(MISSING_FIELD, name, "is missing (a KTO row has a prompt, a completion and a label)")
    value = record[name]
    if isinstance(value, str):
        if not value.strip():
            raise RowError(EMPTY_CONTENT, name, "is empty: there is no answer to score")
        return value
    if isinstance(value, list):
        messages = _turns(value, name, columns)[0]
        if not any(m["role"] == "assistant" and str(m["content"]).strip() for m in messages):
            raise RowError(EMPTY_CONTENT, name, "has no assistant turn with content: there is no answer to score")
        return messages
    raise RowError(WRONG_TYPE, name, f"is {_kind(value)}, expected a string or a list of messages")


def _prompt(record: dict, columns: ColumnNames, completion: list | str) -> list[dict[str, Any]] | str:
    name = columns["prompt"]
    if name not in record:
        raise RowError(MISSING_FIELD, name, "is missing (a KTO row has a prompt, a completion and a label)")
    value = record[name]
    if isinstance(completion, str):
        if not isinstance(value, str):
            raise RowError(WRONG_TYPE, name, f"is {_kind(value)} while {columns['completion']} is a string")
        if not value.strip():
            raise RowError(EMPTY_CONTENT, name, "is empty")
        return value
    if not isinstance(value, list):
        raise RowError(WRONG_TYPE, name, f"is {_kind(value)} while {columns['completion']} is a list of messages")
    return _turns(value, name, columns)[0]


def normalize_unpaired(record: Any, columns: ColumnNames, source: str) -> list[UnpairedAnswer]:
    """One raw record as its usable rows: one for an unpaired row, two for a paired one.

    Raises:
        RowError: the row cannot be used; reason, field and detail say why.
    """
    if not isinstance(record, dict):
        raise RowError(WRONG_TYPE, "", f"is {_kind(record)}, expected an object with prompt, completion and label")
    if columns["completion"] not in record and columns["chosen"] in record and columns["rejected"] in record:
        pair = normalize_pair(record, columns, source)
        return [
            UnpairedAnswer(source, pair.prompt, pair.chosen, True, f"{pair.format}, unpaired"),
            UnpairedAnswer(source, pair.prompt, pair.rejected, False, f"{pair.format}, unpaired"),
        ]
    completion = _completion(record, columns)
    prompt = _prompt(record, columns, completion)
    refuse_images(record, columns, {"prompt": prompt, "completion": completion})
    desirable = _label(record, columns)
    fmt = "unpaired (text)" if isinstance(completion, str) else "unpaired (messages)"
    return [UnpairedAnswer(source, prompt, completion, desirable, fmt)]


class UnpairedSet(Sequence[LabeledRow]):
    """Labelled rows over a TokenizedSet of their sequences.

    Attributes:
        desirable: bool [rows], each row's label.
        lengths, trained_lengths: int64 [rows], tokens and scored tokens; num_tokens, num_trained.
    """

    def __init__(self, sequences: TokenizedSet, desirable: np.ndarray):
        if len(sequences) != len(desirable):
            raise ValueError("an unpaired set has one label per row")
        self.sequences, self.desirable = sequences, np.asarray(desirable, dtype=bool)
        self.lengths, self.trained_lengths = sequences.lengths, sequences.trained_lengths
        self.num_tokens, self.num_trained = sequences.num_tokens, sequences.num_trained
        self.image_rows = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        row = self.sequences[index]
        return LabeledRow(row.input_ids, row.labels, row.source, desirable=bool(self.desirable[index]))

    def source(self, index: int) -> str:
        return self.sequences.source(index)

    def subset(self, indices) -> UnpairedSet:
        rows = np.asarray(indices, dtype=np.int64)
        return UnpairedSet(self.sequences.subset(rows), self.desirable[rows])


def balance_note(desirable: int, undesirable: int, weights: tuple[float, float]) -> str | None:
    """What the data report says about the labels' balance (None when it is fine): one label missing or under
    MIN_LABEL_SHARE, or weights outside the paper's range for these counts, with the weight to set."""
    total = desirable + undesirable
    if total == 0:
        return None
    if min(desirable, undesirable) == 0:
        which = "desirable" if undesirable == 0 else "undesirable"
        return (
            f"all {total:,} rows are labelled {which}: KTO learns from both labels (its reference point comes from "
            "the answers' mismatches); add rows of the other label"
        )
    w_good, w_bad = weights
    ratio = desirable * w_good / (undesirable * w_bad)
    low, high = WEIGHT_RATIO_RANGE
    share = min(desirable, undesirable) / total
    if low <= ratio <= high and share >= MIN_LABEL_SHARE:
        return None
    counts = f"{desirable:,} desirable and {undesirable:,} undesirable rows ({share:.0%} the fewer)"
    if low <= ratio <= high:
        fewer = "desirable" if desirable < undesirable else "undesirable"
        return f"{counts}: the weights balance them, but few {fewer} rows carry half the loss; add {fewer} rows"
    if ratio < low:
        want = undesirable * w_bad / desirable
        advice = f"set preference.desirable_weight between {want * low:.2f} and {want * high:.2f}"
    else:
        want = desirable * w_good / undesirable
        advice = f"set preference.undesirable_weight between {want / high:.2f} and {want / low:.2f}"
    return f"{counts}: the labels are unbalanced for these weights; {advice} (KTO paper, eq. 8)"


def _answers(source: Source, columns: ColumnNames, report: ReportBuilder) -> Iterator[UnpairedAnswer]:
    """Every usable row of one source; every other row reported as skipped."""
    for number, record in read_records(source):
        report.read()
        if isinstance(record, RowProblem):
            report.skip(record)
            continue
        row_source = f"{source.name}:{number}"
        try:
            yield from normalize_unpaired(record, columns, row_source)
        except RowError as e:
            report.skip(RowProblem(row_source, e.reason, e.field, e.detail))


def _batches(entries: list[str], split: str, cfg, report: ReportBuilder) -> Iterator[list[UnpairedAnswer]]:
    try:
        sources = resolve_sources(entries, side=split)
    except SourceError as e:
        report.problem(e.message)
        return
    columns = ColumnNames(cfg.columns)
    batch: list[UnpairedAnswer] = []
    for source in sources:
        try:
            for answer in _answers(source, columns, report):
                batch.append(answer)
                if len(batch) == 2 * ENCODE_PAIRS:
                    yield batch
                    batch = []
        except SourceError as e:
            report.problem(e.message)
    if batch:
        yield batch


def _encode(batch: list[UnpairedAnswer], encoder: PairEncoder) -> list:
    """Each row encoded with only its answer scored, or the RowProblem that skips it."""
    out: list = [None] * len(batch)
    rows, starts, placed = [], [], []
    for k, answer in enumerate(batch):
        try:
            row, start = encoder.answer_row(answer.prompt, answer.completion, answer.source, answer.format)
        except Exception as e:  # the template raised: the row's problem, never the run's
            out[k] = RowProblem(answer.source, "chat template error", "", f"the chat template failed: {e}")
            continue
        rows.append(row)
        starts.append(start)
        placed.append(k)
    for k, result, start in zip(placed, encoder.encoder.encode(rows, keep_text=True), starts, strict=True):
        out[k] = encoder.answer_only(result, start)
    return out


def read_split(
    entries: list[str], split: str, cfg, encoder: PairEncoder, max_examples: int | None = MAX_EXAMPLES
) -> tuple[UnpairedSet, ReportBuilder]:
    """One split's labelled rows and its report (listing up to `max_examples` skipped rows; None: all)."""
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=max_examples)
    builder = TokenizedSetBuilder()
    labels: list[bool] = []
    for batch in _batches(entries, split, cfg, report):
        for answer, result in zip(batch, _encode(batch, encoder), strict=True):
            if isinstance(result, RowProblem):
                report.skip(result)
                continue
            builder.add(result.ids, result.trained, result.source)
            labels.append(answer.desirable)
            report.truncated += int(result.truncated)
            report.formats[answer.format] += 1
    return UnpairedSet(builder.build(), np.array(labels, dtype=bool)), report


@dataclass
class UnpairedData:
    """What the trainer gets for a KTO run: the training and evaluation rows, one report per split."""

    train: UnpairedSet
    eval: UnpairedSet | None
    reports: list[DatasetReport]


def _build(report: ReportBuilder, rows: UnpairedSet, weights: tuple[float, float], held_out: int = 0):
    note = balance_note(int(rows.desirable.sum()), int((~rows.desirable).sum()), weights)
    if note:
        report.note(note)
    return report.build(rows.lengths, rows.trained_lengths, 0, held_out=held_out)


def _nothing_usable(what: str, entries: list[str], report: ReportBuilder) -> DataError:
    names = ", ".join(map(str, entries)) or "(none given)"
    if report.problems:
        reason = report.problems[0]
    elif report.rows_read == 0:
        reason = "the sources hold no rows"
    else:
        counts = ", ".join(f"{count} {reason}" for reason, count in report.skipped.most_common(3))
        first = report.examples[0] if report.examples else ""
        reason = f"none of the {report.rows_read:,} rows is a usable labelled answer ({counts}); first: {first}"
    return DataError(
        f"no usable {what} rows for KTO in {names}: {reason}",
        "a KTO row has a prompt, a completion and a label (true or false), or chosen and rejected answers: run "
        "`hone data check FILE --model MODEL --method kto` for the full report",
    )


def _encoder(cfg, tokenizer) -> PairEncoder:
    return PairEncoder(RowEncoder(tokenizer, max_length=cfg.max_length, overlong=cfg.overlong, train_on="assistant"))


def load_unpaired_data(cfg, tokenizer, *, seed: int = 0, weights: tuple[float, float] = (1.0, 1.0)) -> UnpairedData:
    """The training (and evaluation) rows `cfg` (a DataConfig) names; `weights` (desirable, undesirable) are what
    the balance note judges.

    Raises:
        DataError: no usable row in a split.
    """
    encoder = _encoder(cfg, tokenizer)
    train, train_report = read_split(cfg.train, "train", cfg, encoder)
    if len(train) == 0:
        raise _nothing_usable("training", cfg.train, train_report)
    if cfg.eval:
        eval_set, eval_report = read_split(cfg.eval, "eval", cfg, encoder)
        if len(eval_set) == 0:
            raise _nothing_usable("evaluation", cfg.eval, eval_report)
        reports = [_build(train_report, train, weights), _build(eval_report, eval_set, weights)]
        return UnpairedData(train, eval_set, reports)
    if cfg.eval_fraction > 0 and len(train) >= 2:
        held = hold_out_rows(len(train), cfg.eval_fraction, seed, train_report)
        eval_set, train = train.subset(held.eval_rows), train.subset(held.train_rows)
        reports = [
            _build(train_report, train, weights, held_out=len(held.eval_rows)),
            _build(held.report, eval_set, weights),
        ]
        return UnpairedData(train, eval_set, reports)
    return UnpairedData(train, None, [_build(train_report, train, weights)])


def check_unpaired(
    cfg, tokenizer=None, *, split: str = "train", weights: tuple[float, float] = (1.0, 1.0)
) -> DatasetReport:
    """The report of one split's labelled rows, every skipped row listed: with a tokenizer each row is tokenized too;
    without, only read and checked (`hone data check --method kto`)."""
    entries = cfg.train if split == "train" else cfg.eval
    if tokenizer is not None:
        rows, report = read_split(entries, split, cfg, _encoder(cfg, tokenizer), max_examples=None)
        return _build(report, rows, weights)
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=None)
    labels: list[bool] = []
    for batch in _batches(entries, split, cfg, report):
        labels += [answer.desirable for answer in batch]
        report.formats.update(answer.format for answer in batch)
    good = sum(labels)
    note = balance_note(good, len(labels) - good, weights)
    if note:
        report.note(note)
    empty = np.zeros(0, np.int64)
    return report.build(empty, empty, 0, rows_kept=len(labels))

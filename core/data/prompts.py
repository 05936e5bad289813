"""Prompt data for reinforcement learning (GRPO): rows of a prompt to sample answers to, and the columns rewards read.

Row shapes (column names as `data.columns` maps them), the prompt sides of SFT's formats:
- {"prompt": str, ...}: one user turn;
- {"prompt": [messages], ...} or {"messages": [messages], ...} ending on a user turn.
The prompt is rendered through the chat template with the assistant's turn opened, then tokenized. Every column of
the row (e.g. `answer`) is kept for the rewards. A row is skipped, with its file, row and field named, when it has no
prompt, its messages end on an assistant turn, or its prompt is longer than data.max_length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hone.core.data.formats import ColumnNames, _kind, _turns
from hone.core.data.loaders import SourceError, read_records, resolve_sources
from hone.core.data.report import ReportBuilder
from hone.core.data.rows import (
    EMPTY_CONTENT,
    MISSING_FIELD,
    TEMPLATE_ERROR,
    TOO_LONG,
    WRONG_TYPE,
    RowError,
    RowProblem,
)
from hone.core.data.template import render_conversation
from hone.core.data.text_only import refuse_images
from hone.core.errors import DataError
from hone.core.events import DatasetReport

ENDS_ON_ANSWER = "ends on an assistant turn"


@dataclass
class PromptRow:
    """One prompt: its token ids (with the assistant's turn opened), its text, and the row's columns."""

    input_ids: list[int]
    text: str
    columns: dict[str, Any]
    source: str

    @property
    def labels(self) -> list[int]:
        return [-100] * len(self.input_ids)


class PromptSet(Sequence[PromptRow]):
    """The prompts of a split.

    Attributes:
        lengths: int64 [rows], the tokens a row's step holds: `group` × (prompt + `max_completion` tokens), what
            packing plans micro-batches by. trained_lengths: int64 [rows], `group` × `max_completion`.
    """

    def __init__(self, rows: list[PromptRow], group: int, max_completion: int):
        self.rows, self.group, self.max_completion = rows, group, max_completion
        prompt = np.array([len(r.input_ids) for r in rows], dtype=np.int64)
        self.lengths = group * (prompt + max_completion)
        self.trained_lengths = np.full(len(rows), group * max_completion, dtype=np.int64)
        self.num_tokens, self.num_trained = int(self.lengths.sum()), int(self.trained_lengths.sum())
        self.image_rows = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def source(self, index: int) -> str:
        return self.rows[index].source


def prompt_messages(record: Any, columns: ColumnNames) -> list[dict[str, Any]]:
    """The prompt of one record as messages ending on a user turn.

    Raises:
        RowError: the row has no usable prompt; reason, field and detail say why.
    """
    if not isinstance(record, dict):
        raise RowError(WRONG_TYPE, "", f"is {_kind(record)}, expected an object with a prompt")
    name = columns["prompt"] if columns["prompt"] in record else columns["messages"]
    if name not in record:
        raise RowError(MISSING_FIELD, columns["prompt"], "is missing (a GRPO row has a prompt or messages)")
    value = record[name]
    if isinstance(value, str):
        if not value.strip():
            raise RowError(EMPTY_CONTENT, name, "is empty")
        refuse_images(record, columns, {})
        return [{"role": "user", "content": value}]
    messages = _turns(value, name, columns)[0]
    refuse_images(record, columns, {"prompt" if name == columns["prompt"] else "messages": messages})
    if messages[-1]["role"] == "assistant":
        raise RowError(
            ENDS_ON_ANSWER, name, "ends on an assistant turn: GRPO samples the answer, so end each row on the user's"
        )
    return messages


def _json_safe(value: Any) -> Any:
    """A column value as rewards see it: numpy scalars and arrays (Parquet) as plain Python."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def encode_prompt(record: Any, where: str, columns: ColumnNames, tokenizer, max_length: int) -> PromptRow | RowProblem:
    """One record as a prompt the policy answers: rendered with the chat template and the assistant's turn opened,
    tokenized; or why training skips it (a RowProblem read from the file, a row without a prompt, a template that
    fails on it, a prompt over `max_length`)."""
    if isinstance(record, RowProblem):
        return record
    try:
        text = render_conversation(tokenizer, prompt_messages(record, columns), add_generation_prompt=True)
    except RowError as e:
        return RowProblem(where, e.reason, e.field, e.detail)
    except (ValueError, TypeError) as e:  # the chat template raised on this row
        return RowProblem(where, TEMPLATE_ERROR, "", f"the chat template failed: {e}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_length:
        return RowProblem(where, TOO_LONG, columns["prompt"], f"has {len(ids)} tokens")
    return PromptRow(ids, text, {k: _json_safe(v) for k, v in record.items()}, where)


def _rows(entries: list[str], split: str, cfg, tokenizer, report: ReportBuilder) -> Iterator[PromptRow]:
    columns = ColumnNames(cfg.columns)
    try:
        sources = resolve_sources(entries, side=split)
    except SourceError as e:
        report.problem(e.message)
        return
    for source in sources:
        try:
            for number, record in read_records(source):
                report.read()
                row = encode_prompt(record, f"{source.name}:{number}", columns, tokenizer, cfg.max_length)
                if isinstance(row, RowProblem):
                    report.skip(row)
                    continue
                report.formats["prompt"] += 1
                yield row
        except SourceError as e:
            report.problem(e.message)


def check_prompts(cfg, tokenizer=None, *, split: str = "train") -> DatasetReport:
    """The report of one split's GRPO prompts, every skipped row listed: with a tokenizer each prompt is rendered
    with the chat template and counted (as a run reads it); without, every row is read and its prompt found (text,
    or messages ending on a user turn)."""
    columns = ColumnNames(cfg.columns)
    entries = cfg.train if split == "train" else cfg.eval
    report = ReportBuilder(split, [str(e) for e in entries], max_examples=None)
    if tokenizer is not None:
        lengths = [
            len(row.input_ids) for row in _rows(entries, split, cfg, getattr(tokenizer, "tokenizer", tokenizer), report)
        ]
        counts = np.asarray(lengths, dtype=np.int64)
        return report.build(counts, np.zeros_like(counts), 0)
    try:
        sources = resolve_sources(entries, side=split)
    except SourceError as e:
        report.problem(e.message)
        sources = []
    kept = 0
    for source in sources:
        try:
            for number, record in read_records(source):
                report.read()
                if isinstance(record, RowProblem):
                    report.skip(record)
                    continue
                try:
                    prompt_messages(record, columns)
                except RowError as e:
                    report.skip(RowProblem(f"{source.name}:{number}", e.reason, e.field, e.detail))
                    continue
                report.formats["prompt"] += 1
                kept += 1
        except SourceError as e:
            report.problem(e.message)
    empty = np.zeros(0, np.int64)
    return report.build(empty, empty, 0, rows_kept=kept)


@dataclass
class PromptData:
    """What the trainer gets for a GRPO run: the training prompts and their report (no evaluation split)."""

    train: PromptSet
    eval: None = None
    reports: list[DatasetReport] = field(default_factory=list)


def load_prompt_data(cfg, tokenizer, *, group: int, max_completion: int) -> PromptData:
    """The training prompts `cfg` (a DataConfig) names, tokenized with `tokenizer`.

    Raises:
        DataError: no usable prompt.
    """
    text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    report = ReportBuilder("train", [str(e) for e in cfg.train])
    rows = list(_rows(cfg.train, "train", cfg, text_tokenizer, report))
    prompts = PromptSet(rows, group, max_completion)
    if cfg.eval or cfg.eval_fraction:
        report.note("GRPO runs report rewards per step and do not evaluate a loss: data.eval is not read")
    if not rows:
        reason = report.problems[0] if report.problems else f"none of the {report.rows_read:,} rows has a prompt"
        raise DataError(
            f"no usable prompts in {', '.join(map(str, cfg.train))}: {reason}",
            'a GRPO row has a "prompt" (text or messages ending on a user turn), or "messages" ending on one',
        )
    return PromptData(prompts, None, [report.build(prompts.lengths, prompts.trained_lengths, 0)])

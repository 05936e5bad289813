"""What the Data page runs on a worker thread: the check of the training and evaluation data (validated, and
tokenized with the chosen model's tokenizer), the rows the preview shows, and one row opened in the inspector.

Each goes through hone.core.api and returns plain objects the page shows; none touches a widget.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hone.app.pages.data_views import raw_row
from hone.core.config import DataConfig, ModelConfig
from hone.core.events import DatasetReport

# Rows the preview table shows: enough to judge the data at a glance, few enough to tokenize in a blink.
PREVIEW_ROWS = 50


@dataclass
class DataCheck:
    """What a check found: the report, every kept row's length, the first rows as the inspector sees them, and the
    evaluation data's report where the run has evaluation files."""

    report: DatasetReport
    lengths: np.ndarray  # int64 [rows kept], tokens per row (empty without a tokenizer)
    preview: list[Any]  # RowView of the first kept rows of the first source
    tokenizer: Any  # kept for the inspector (a Python object; the GUI never calls into it on its thread)
    eval_report: DatasetReport | None = None

    @property
    def problems(self) -> list[str]:
        """Files that could not be read at all, of either split."""
        return self.report.problems + (self.eval_report.problems if self.eval_report else [])


def load_tokenizer_for(model_cfg: ModelConfig) -> Any:
    """The tokenizer training with the chosen model would use, as `hone data check --model` loads it (no weights are
    read, no GGUF converted; downloads nothing the model load would not)."""
    from hone.core.api import tokenizer_for

    return tokenizer_for(model_cfg)


def check(data_cfg: DataConfig, model_cfg: ModelConfig, progress=None) -> DataCheck:
    """Validate and tokenize the training and evaluation splits on a worker thread; structural checks only without a
    model."""
    from hone.core.api import check_data

    tokenizer = None
    if model_cfg.name_or_path:
        if progress:
            progress(("Loading the tokenizer…", 0.0))
        tokenizer = load_tokenizer_for(model_cfg)
    report, tokenized = check_data(
        data_cfg,
        tokenizer,
        split="train",
        progress=(lambda message, fraction: progress((message, fraction))) if progress else None,
    )
    preview = []
    if tokenized is not None and len(tokenized):
        preview = preview_rows(data_cfg, tokenizer, tokenized)
    lengths = tokenized.lengths if tokenized is not None else np.zeros(0, np.int64)
    eval_report = None
    if data_cfg.eval:
        if progress:
            progress(("Checking the evaluation data…", 1.0))
        eval_report, _ = check_data(data_cfg, tokenizer, split="eval")
    return DataCheck(report, np.asarray(lengths), preview, tokenizer, eval_report)


def preview_rows(data_cfg: DataConfig, tokenizer: Any, tokenized: Any) -> list[Any]:
    """RowViews of the first kept rows that come from the first file (row numbers as the report prints them)."""
    from hone.core.api import inspect_rows

    first_source = tokenized.source(0).rpartition(":")[0]
    numbers = []
    for index in range(len(tokenized)):
        name, _, number = tokenized.source(index).rpartition(":")
        if name == first_source:
            numbers.append(int(number))
            if len(numbers) == PREVIEW_ROWS:
                break
    entry = entry_for(first_source, data_cfg.train)
    return inspect_rows(entry, tokenizer, numbers, cfg=data_cfg)


def inspect(entry: str, row: int, data_cfg: DataConfig, tokenizer: Any) -> tuple[Any, str]:
    """(RowView or None without a tokenizer, the row as the file holds it where it is skipped or not viewed)."""
    from hone.core.api import inspect_row

    view = inspect_row(entry, tokenizer, row, cfg=data_cfg) if tokenizer is not None else None
    return view, (raw_row(entry, row) if view is None or view.problem else "")


def entry_for(source_name: str, entries: list[str]) -> str:
    """The data entry a source came from (a source is a file; the entry may be a folder holding it)."""
    for entry in entries:
        if Path(source_name).name == Path(entry).name or source_name == entry:
            return entry
    return source_name

"""What the Data page runs in the Studio's helper process (hone.app.helper_process): the check of the training and
evaluation data (validated, and tokenized with the chosen model's tokenizer), the rows the preview shows, and one row
opened in the inspector. Free of Qt, so that the helper imports only this and the engine.

Each goes through hone.core.api and returns plain objects the page shows. The tokenizer stays in the helper (loaded
once per model, `tokenizer_for_model`): the window never imports transformers for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hone.core.config import PREFERENCE_METHODS, UNPAIRED_METHODS, DataConfig, ModelConfig
from hone.core.events import DatasetReport

# Rows the preview table shows: enough to judge the data at a glance, few enough to tokenize in a blink.
PREVIEW_ROWS = 50
_tokenizers: dict[str, Any] = {}  # in the helper process: the tokenizer of each model checked, by its settings


@dataclass
class DataCheck:
    """What a check found: the report, every kept row's length, the first rows as the inspector sees them, and the
    evaluation data's report where the run has evaluation files."""

    report: DatasetReport
    lengths: np.ndarray  # int64 [rows kept], tokens per row (empty without a tokenizer)
    preview: list[Any]  # RowView of the first kept rows of the first source
    model: ModelConfig | None  # whose tokenizer counted the tokens (the inspector's); None: no model chosen
    eval_report: DatasetReport | None = None
    method: str = "sft"  # the training method the rows were read for (preference methods read pairs or answers)

    @property
    def problems(self) -> list[str]:
        """Files that could not be read at all, of either split."""
        return self.report.problems + (self.eval_report.problems if self.eval_report else [])


def load_tokenizer_for(model_cfg: ModelConfig) -> Any:
    """The tokenizer training with the chosen model would use, as `hone data check --model` loads it (no weights are
    read, no GGUF converted; downloads nothing the model load would not)."""
    from hone.core.api import tokenizer_for

    return tokenizer_for(model_cfg)


def tokenizer_for_model(model_cfg: ModelConfig) -> Any:
    """`load_tokenizer_for`, once per model settings in this process."""
    key = json.dumps([model_cfg.name_or_path, model_cfg.gguf_file, model_cfg.revision, model_cfg.trust_remote_code])
    if key not in _tokenizers:
        _tokenizers.clear()  # one model at a time: a tokenizer can hold hundreds of MB
        _tokenizers[key] = load_tokenizer_for(model_cfg)
    return _tokenizers[key]


def check(
    data_cfg: DataConfig,
    model_cfg: ModelConfig,
    progress=None,
    *,
    method: str = "sft",
    weights: tuple[float, float] = (1.0, 1.0),
) -> DataCheck:
    """Validate and tokenize the training and evaluation splits on a worker thread; structural checks only without a
    model. Preference methods read pairs, KTO labelled answers (`weights`: its desirable and undesirable weights,
    which the labels' balance note judges): `check_preference`."""
    from hone.core.api import check_data

    if method in PREFERENCE_METHODS + UNPAIRED_METHODS:
        return check_preference(data_cfg, model_cfg, progress, method=method, weights=weights)
    tokenizer = None
    if model_cfg.name_or_path:
        if progress:
            progress(("Loading the tokenizer…", 0.0))
        tokenizer = tokenizer_for_model(model_cfg)
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
    return DataCheck(report, np.asarray(lengths), preview, model_cfg if tokenizer is not None else None, eval_report)


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


def inspect(
    entry: str, row: int, data_cfg: DataConfig, model_cfg: ModelConfig | None, method: str = "sft"
) -> tuple[Any, str]:
    """(RowView, or PreferenceView for a preference method's row, or None without a model; the row as the file holds
    it where it is skipped or not viewed)."""
    from hone.core.api import inspect_preference_rows, inspect_row

    view = None
    if model_cfg is not None and method in PREFERENCE_METHODS + UNPAIRED_METHODS:
        (view,) = inspect_preference_rows(entry, tokenizer_for_model(model_cfg), [row], cfg=data_cfg, method=method)
    elif model_cfg is not None:
        view = inspect_row(entry, tokenizer_for_model(model_cfg), row, cfg=data_cfg)
    return view, (raw_row(entry, row) if view is None or view.problem else "")


def check_preference(
    data_cfg: DataConfig, model_cfg: ModelConfig, progress=None, *, method: str, weights: tuple[float, float]
) -> DataCheck:
    """`check` of a preference method's data, read as training reads it (pairs, or KTO's labelled answers). The
    lengths are each answer's sequence (prompt and answer), which data.max_length bounds; the preview is
    PreferenceViews of the first rows of the first file."""
    from hone.core.api import check_preference as check_rows

    tokenizer = None
    if model_cfg.name_or_path:
        if progress:
            progress(("Loading the tokenizer…", 0.0))
        tokenizer = tokenizer_for_model(model_cfg)
    if progress:
        progress(("Checking the preference rows…", 0.5))
    report, rows = check_rows(data_cfg, tokenizer, split="train", method=method, weights=weights)
    preview = preference_preview(data_cfg, tokenizer, rows, method) if rows is not None and len(rows) else []
    lengths = rows.sequences.lengths if rows is not None else np.zeros(0, np.int64)
    eval_report = None
    if data_cfg.eval:
        if progress:
            progress(("Checking the evaluation data…", 1.0))
        eval_report, _ = check_rows(data_cfg, tokenizer, split="eval", method=method, weights=weights)
    model = model_cfg if tokenizer is not None else None
    return DataCheck(report, np.asarray(lengths), preview, model, eval_report, method=method)


def preference_preview(data_cfg: DataConfig, tokenizer: Any, rows: Any, method: str) -> list[Any]:
    """PreferenceViews of the first kept rows of the first file (a KTO row kept as two answers is one row here)."""
    from hone.core.api import inspect_preference_rows

    first_source = rows.source(0).rpartition(":")[0]
    numbers: list[int] = []
    for index in range(len(rows)):
        name, _, number = rows.source(index).rpartition(":")
        if name == first_source and int(number) not in numbers[-1:]:
            numbers.append(int(number))
            if len(numbers) == PREVIEW_ROWS:
                break
    entry = entry_for(first_source, data_cfg.train)
    return inspect_preference_rows(entry, tokenizer, numbers, cfg=data_cfg, method=method)


def raw_row(entry: str, row: int) -> str:
    """Row `row` (1-based, as the report numbers it) of one data file as it holds it: a record as indented JSON, a
    line that is not a JSON object as its text.

    Raises:
        SourceError: the file cannot be read.
    """
    from hone.core.api import read_records, resolve_sources

    sources = resolve_sources([entry])
    if len(sources) != 1:
        return ""
    source = sources[0]
    for number, record in read_records(source):
        if number == row and isinstance(record, dict):
            return json.dumps(record, indent=2, ensure_ascii=False, default=str)
        if number >= row:
            break
    if source.kind == "jsonl" and source.path is not None:  # a line the reader could not parse: show its text
        with open(source.path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if number == row:
                    return line.decode("utf-8", errors="replace").rstrip("\r\n")
    return ""


def entry_for(source_name: str, entries: list[str]) -> str:
    """The data entry a source came from (a source is a file; the entry may be a folder holding it)."""
    for entry in entries:
        if Path(source_name).name == Path(entry).name or source_name == entry:
            return entry
    return source_name

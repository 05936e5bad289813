"""Datasets: read every common format, validate every row, render through the chat template, mask the labels,
plan packed rows, and show a row as the model will see it.

Public API (what the trainer, the CLI and the GUI use):
    load_training_data(cfg, tokenizer, *, seed, cache_dir, progress) -> TrainingData(train, eval, reports)
    check_data(cfg, tokenizer=None, *, split) -> (DatasetReport, TokenizedSet | None)
    TokenizedSet / TokenizedRow / ImageRef            the tokenized rows (labels -100 where no loss)
    plan_packs(lengths, budget, *, seed, epoch, method) / packing_efficiency(plan, lengths, budget)
    inspect.inspect_row(entry, tokenizer, row, ...) -> RowView  (rendered text + per-token trained flags)
    format_report(report) -> str                      the terminal table of a DatasetReport

Image URLs are fetched once, during the data check, into the data cache (hone.core.data.fetch: a size cap, a total
time limit, http(s) only, no private or loopback hosts unless data.allow_private_urls).

Importing this package is light (numpy only); transformers, datasets, pyarrow and Pillow load on use.
"""

from hone.core.data.packing import packing_efficiency, plan_packs
from hone.core.data.pipeline import TrainingData, check_data, load_training_data
from hone.core.data.report import format_report
from hone.core.data.rows import ImageRef
from hone.core.data.tokenized import IGNORE_INDEX, TokenizedRow, TokenizedSet

__all__ = [
    "IGNORE_INDEX",
    "ImageRef",
    "TokenizedRow",
    "TokenizedSet",
    "TrainingData",
    "check_data",
    "format_report",
    "load_training_data",
    "packing_efficiency",
    "plan_packs",
]

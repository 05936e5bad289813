"""Whether the training data holds a row a run can train on, known before Start.

The Data page's check (hone.core.api.check_data) without a tokenizer: every structural check (files, JSON, fields,
roles) and no model. It reads every row, so it runs on a worker thread (a Task), once per data selection and file
version (the Data page's Check data also tokenizes, with the model's tokenizer, and shows every row).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from PySide6.QtCore import QObject, Signal

from hone.app.workers import Task, TaskError
from hone.core.config import DataConfig

NEXT_STEP = "Choose other training data on the Data page, or fix the file (Check data there lists every row)."
# Seconds after which a problem with data that is not a local file (a Hugging Face dataset id: the Hub unreachable,
# offline mode) is checked again when asked: the network or the cache may have changed since, and no file's
# modification time says so. A refused check takes at most ~1.5 s (hone.core.data.hub_datasets), so once per 10 s
# costs little, and the Train page asks on each change of the form and each time it is shown.
RECHECK_S = 10.0


def row_kind(method: str) -> str:
    """What a training method reads from each row: "rows" (supervised), "pairs" (dpo, simpo, orpo), "answers"
    (kto's labelled answers) or "prompts" (grpo)."""
    from hone.core.config import PREFERENCE_METHODS, UNPAIRED_METHODS

    if method in PREFERENCE_METHODS:
        return "pairs"
    if method in UNPAIRED_METHODS:
        return "answers"
    return "prompts" if method == "grpo" else "rows"


def usable_rows_problems(data_cfg: DataConfig, method: str = "sft") -> list[str]:
    """Why the training data of `data_cfg` gives a run of `method` nothing to train on, one sentence each; empty
    when it has a usable row. Reads every row (a worker thread's job)."""
    from hone.core import api

    kind = row_kind(method)
    if kind == "pairs":
        report = api.check_pairs(data_cfg, split="train")
    elif kind == "answers":
        report = api.check_unpaired(data_cfg, split="train")
    elif kind == "prompts":
        report = api.check_prompts(data_cfg, split="train")
    else:
        report, _ = api.check_data(data_cfg, None, split="train")
    return report_problems(report)


def report_problems(report: Any) -> list[str]:
    """The problems of a training split's DatasetReport that leave a run without rows (see usable_rows_problems)."""
    if report.rows_kept:
        return []
    unreadable = [f"The training data cannot be read: {problem}." for problem in report.problems]
    if report.rows_read:
        reasons = sorted(report.skipped.items(), key=lambda kv: -kv[1])
        why = "; ".join(f"{count:,} {reason}" for reason, count in reasons[:3])
        first = f" First: {report.skipped_examples[0]}." if report.skipped_examples else ""
        files = ", ".join(os.path.basename(f) for f in report.files)
        none = (
            f"None of the {report.rows_read:,} training rows can be trained on"
            if report.rows_read != 1
            else "The only training row cannot be trained on"
        )
        return [*unreadable, f"{none} ({files}: {why}).{first} {NEXT_STEP}"]
    if unreadable:
        return [*unreadable[:-1], f"{unreadable[-1]} {NEXT_STEP}"]
    files = ", ".join(report.files)
    return [f"The training data holds no rows ({files}). {NEXT_STEP}"]


def data_key(data_cfg: DataConfig, method: str = "sft") -> str:
    """What a check's answer depends on: what the method reads from a row, the data settings and each local entry's
    size and modification time."""
    versions = []
    for entry in data_cfg.train:
        try:
            info = os.stat(entry)
            versions.append([info.st_size, info.st_mtime_ns])
        except (OSError, ValueError):
            versions.append(None)  # a hub id or a bundled name: the settings say it all
    return json.dumps([dataclasses.asdict(data_cfg), versions, row_kind(method)], default=str)


class DataReadiness(QObject):
    """The answer for the data selected last: `problems(data_cfg)` (empty while unknown) and `pending(data_cfg)`.

    Signals:
        changed(): an answer came; the Train page shows it.
    """

    changed = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._answers: dict[str, list[str]] = {}
        self._answered_at: dict[str, float] = {}  # time.monotonic() of each answer
        self._checking: str | None = None
        self._wanted: tuple[DataConfig, str] | None = None  # asked for while another check ran: checked next
        self.task: Task | None = None

    def request(self, data_cfg: DataConfig, method: str = "sft") -> None:
        """Check `data_cfg`'s training data for a run of `method` in the background unless its answer is known or
        on its way."""
        if not data_cfg.train:
            return
        key = data_key(data_cfg, method)
        if (key in self._answers and not self._stale(key)) or key == self._checking:
            return
        if self._checking is not None:
            self._wanted = (data_cfg, method)
            return
        self._checking = key
        self.task = Task(
            _check,
            data_cfg,
            method,
            on_result=lambda problems, key=key: self._answered(key, problems),
            on_error=lambda error, key=key: self._answered(key, [_error_text(error)]),
        )

    def pending(self, data_cfg: DataConfig, method: str = "sft") -> bool:
        return bool(data_cfg.train) and data_key(data_cfg, method) not in self._answers

    def problems(self, data_cfg: DataConfig, method: str = "sft") -> list[str]:
        return self._answers.get(data_key(data_cfg, method), []) if data_cfg.train else []

    def _stale(self, key: str) -> bool:
        """A problem found with data that is not all local files, RECHECK_S ago or longer (the answer shown until the
        next one comes)."""
        if not self._answers[key] or time.monotonic() - self._answered_at[key] < RECHECK_S:
            return False
        return any(version is None for version in json.loads(key)[1])

    def _answered(self, key: str, problems: list[str]) -> None:
        self._answers[key] = problems
        self._answered_at[key] = time.monotonic()
        if key == self._checking:
            self._checking = None
            wanted, self._wanted = self._wanted, None
            if wanted is not None:
                self.request(*wanted)
        self.changed.emit()


def _check(data_cfg: DataConfig, method: str) -> list[str]:
    # looked up at call time, so a test can watch which thread reads the rows
    return usable_rows_problems(data_cfg, method)


def _error_text(error: TaskError) -> str:
    advice = f" {error.advice[:1].upper()}{error.advice[1:]}" if error.advice else f" {NEXT_STEP}"
    return f"The training data could not be checked: {error.message}.{advice}"

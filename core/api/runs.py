"""Start, resume, follow and stop runs, and list the run folders.

A run trains in this process (`Trainer(config, control, resume_dir=...).run()`: `hone train`, and the Studio on
Windows) or in a child process (hone.core.api.child_run: the Studio on Linux); either way it is a generator of
events, paused and stopped through a `RunControl` (hone.core.control). A run folder is followed by reading its
metrics.jsonl (`read_events`, `EventTail`) while its lock says a process trains in it (`in_use`, `read_holder`), and
paused and stopped from another window through the folder (`can_pause`, `request_pause`, `can_stop`, `request_stop`).
Every reader of a run folder's files checks what it reads: a run whose run.json cannot be read lists as DAMAGED with
the reason and what to do, a line of metrics.jsonl that holds no event is skipped and counted (`EventTail.skipped`),
and a resume of a damaged config.toml or checkpoint stops with one HoneError naming the file.

Light to import: the names whose engine module loads torch or numpy (the trainer, torchrun's world, the input
checks) load it when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hone.core.train.resume_checks import DATA_CHANGED, check_resume
from hone.core.train.run_dir import (
    ADAPTER_DIR,
    CONFIG_FILE,
    DAMAGED,
    INTERRUPTED,
    LOG_FILE,
    METRICS_FILE,
    EventTail,
    RunSummary,
    list_runs,
    live_summary,
    read_events,
    speed_choice,
    step_line,
)
from hone.core.train.run_lock import in_use, read_holder
from hone.core.train.run_requests import can_pause, can_stop, request_pause, request_stop
from hone.core.train.samples_file import SAMPLES_FILE, SampleStep, read_samples
from hone.core.train.sharding import refusal as sharding_refusal

if TYPE_CHECKING:
    from hone.core.train.distributed import World

# Names whose engine module imports torch (or numpy): resolved on first use.
_LAZY = {
    "Trainer": "hone.core.train.trainer",
    "check_inputs": "hone.core.train.input_checks",
    "check_model": "hone.core.train.input_checks",
    "check_data_files": "hone.core.train.input_checks",
    "PEER_ADVICE": "hone.core.train.distributed",
    "MetricsReader": "hone.core.train.metrics_series",
    "StepColumns": "hone.core.train.metrics_series",
    "downsample": "hone.core.train.metrics_series",
    "MethodColumnsReader": "hone.core.train.method_columns",
    "StepBlock": "hone.core.train.method_columns",
    "METHOD_FIELDS": "hone.core.train.method_columns",
}

__all__ = [
    "ADAPTER_DIR",
    "CONFIG_FILE",
    "DAMAGED",
    "DATA_CHANGED",
    "INTERRUPTED",
    "LOG_FILE",
    "METRICS_FILE",
    "SAMPLES_FILE",
    "EventTail",
    "SampleStep",
    "RunSummary",
    "can_pause",
    "can_stop",
    "check_resume",
    "in_use",
    "list_runs",
    "live_summary",
    "process_world",
    "read_events",
    "read_holder",
    "read_samples",
    "request_pause",
    "request_stop",
    "sharding_refusal",
    "speed_choice",
    "step_line",
    *_LAZY,
]


def process_world() -> World:
    """This process's place among the run's processes, as torchrun's environment describes it (one plain process
    outside torchrun). Loads torch."""
    from hone.core.train import distributed

    return distributed.from_environment()


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

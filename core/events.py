"""Events a run emits: frozen dataclasses, stdlib only, one JSON line each in the run's metrics.jsonl.

The trainer yields them; the CLI prints them; the GUI worker re-emits them over a Qt signal. Every event
round-trips through `to_dict` / `from_dict`, which is how the GUI's run history reads old runs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """Base of all events; `time` is wall-clock seconds since the epoch."""

    time: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class RunStarted(Event):
    """The model and data are loaded and the first step is about to run."""

    run_dir: str
    model: str
    device: str
    dtype: str
    params_total: int
    params_trainable: int
    total_steps: int
    tokens_per_epoch: int
    resumed_from_step: int = 0
    is_moe: bool = False
    is_vision: bool = False
    # Chosen speed paths and why, e.g. {"attention": "varlen (CUDA, torch 2.11)"}.
    speed_paths: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    processes: int = 1  # processes training the run together (one per GPU under torchrun)


@dataclass(frozen=True)
class DatasetReport(Event):
    """What happened to every row the user gave: kept, skipped (by reason, with row numbers), truncated."""

    split: str
    files: list[str]
    rows_read: int
    rows_kept: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    skipped_examples: list[str] = field(default_factory=list)  # "file:row: field: why", first few
    truncated: int = 0
    image_rows: int = 0
    tokens: int = 0  # tokens per epoch (kept rows, after truncation)
    trained_tokens: int = 0  # tokens that carry loss
    length_min: int = 0
    length_median: int = 0
    length_p95: int = 0
    length_max: int = 0
    format: str = ""
    held_out: int = 0  # rows moved from this split to the eval split (data.eval_fraction)
    problems: list[str] = field(default_factory=list)  # whole sources that could not be read, and why
    notes: list[str] = field(default_factory=list)  # choices made that the user should know about


@dataclass(frozen=True)
class StepMetrics(Event):
    """One optimizer step. `tokens` counts real (non-padding) tokens; times are synchronized."""

    step: int
    total_steps: int
    epoch: float
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    trained_tokens: int
    tokens_per_s: float
    step_time: float
    elapsed: float
    packing_efficiency: float = 1.0
    mem_allocated: int = 0  # bytes, peak during the step
    mem_reserved: int = 0  # bytes
    offload_bytes: int = 0  # bytes moved to host for checkpoints during the step
    copy_stall_s: float = 0.0  # time compute waited for checkpoint reloads
    buffer_bytes: int = 0  # device memory held by offload reload buffers
    data_wait_s: float = 0.0  # time the step waited for its batches (collated in the background, or here)
    expert_load: list[int] = field(default_factory=list)  # tokens per expert (MoE), summed over layers
    mem_by_gpu: list[int] = field(default_factory=list)  # bytes, each process's peak, when several train the run

    @property
    def waiting_for_data(self) -> float:
        """The share of the step spent waiting for its batches, when worth saying (the background collation, e.g.
        image decoding, fell behind the GPU); 0.0 below 5% (the hand-over itself) and at step 1, which always
        collates its own batches."""
        if self.step <= 1 or self.step_time <= 0 or self.data_wait_s < 0.05 * self.step_time:
            return 0.0
        return self.data_wait_s / self.step_time


@dataclass(frozen=True)
class EvalMetrics(Event):
    """Mean loss over the evaluation rows' trained tokens."""

    step: int
    loss: float
    tokens: int


@dataclass(frozen=True)
class CheckpointSaved(Event):
    step: int
    path: str


@dataclass(frozen=True)
class Notice(Event):
    """Something the user should know that is not an error: a speed path fell back, a choice was made."""

    topic: str
    message: str
    level: str = "info"  # info | warning
    # The step a change takes effect from (0: before the first step), for notices the charts mark, such as the
    # memory planner's re-plans; None for notices about the run as a whole.
    step: int | None = None


@dataclass(frozen=True)
class RunPaused(Event):
    step: int


@dataclass(frozen=True)
class RunResumed(Event):
    step: int


@dataclass(frozen=True)
class RunFinished(Event):
    """The run ended normally (`stopped` when the user asked it to stop early)."""

    step: int
    run_dir: str
    adapter_dir: str
    final_loss: float
    elapsed: float
    stopped: bool = False
    eval_loss: float | None = None


@dataclass(frozen=True)
class RunFailed(Event):
    """The run could not go on. `reason` says what happened, `advice` what to change."""

    reason: str
    advice: str = ""
    step: int = 0
    details: str = ""  # traceback for the log, never shown as the message
    code: str = ""  # the HoneError's code: a kind of failure a front end can offer to fix ("data-changed")


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        RunStarted,
        DatasetReport,
        StepMetrics,
        EvalMetrics,
        CheckpointSaved,
        Notice,
        RunPaused,
        RunResumed,
        RunFinished,
        RunFailed,
    )
}


def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's type under "event"."""
    return {"event": type(event).__name__, **dataclasses.asdict(event)}


def from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event written by `to_dict`; unknown keys (from newer versions) are ignored."""
    cls = EVENT_TYPES[data["event"]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})

"""One run status in words for the whole Studio: the sidebar badge, the Monitor's pill and the Runs list say the same
word for the same run.

A run's folder says running while a process trains it; whether that process is this window's or another's, and
whether it is paused, is read from the end of its metrics.jsonl (`progress`): run.json is written at checkpoints
only, so its step lags behind a run that trains on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hone.core.events import EventError, RunPaused, RunResumed, RunStarted, StepMetrics, from_line

# The Monitor's states and run.json's statuses, as the Studio names them.
LABELS = {
    "idle": "Idle",
    "starting": "Starting",
    "running": "Training",
    "elsewhere": "Training elsewhere",
    "paused": "Paused",
    "finished": "Finished",
    "stopped": "Stopped",
    "failed": "Failed",
    "interrupted": "Interrupted",
    "damaged": "Damaged",
}
# How much of metrics.jsonl's end is read for a running run's latest step: a few hundred step lines, so a list of many
# runs stays instant.
PROGRESS_TAIL_BYTES = 64 * 1024


def status_word(status: str) -> str:
    """The word for `status` (a Monitor state or a run.json status)."""
    return LABELS.get(status, status.capitalize())


@dataclass(frozen=True)
class Progress:
    """Where a running run is, from the end of its metrics.jsonl."""

    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    paused: bool = False  # its last word is RunPaused: it waits for a Resume


def progress(run_dir: str | Path) -> Progress:
    """The latest step and whether the run is paused, from the last lines of its metrics.jsonl (Progress() when it
    holds none)."""
    from hone.core.api import METRICS_FILE

    try:
        with open(Path(run_dir) / METRICS_FILE, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - PROGRESS_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return Progress()
    step: StepMetrics | None = None
    paused: bool | None = None
    for line in reversed(tail.splitlines()):
        if step is not None and paused is not None:
            break
        try:
            event = from_line(line)
        except EventError:
            continue  # the tail's first line may be cut, a line being written too
        if isinstance(event, StepMetrics) and step is None:
            step = event
        elif isinstance(event, (RunPaused, RunResumed, RunStarted)) and paused is None:
            paused = isinstance(event, RunPaused)
    if step is None:
        return Progress(paused=bool(paused))
    return Progress(step.step, step.total_steps, step.loss, bool(paused))

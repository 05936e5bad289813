"""What keeps a run when the machine cuts it off: checkpoints by time, and a lost GPU told apart from a failed run.

`CheckpointClock` says when a checkpoint by time is due (output.checkpoint_minutes of training since the last
one), so a kill -9, a crash or a power cut costs minutes, never the run; `checkpoint_notice` says so in the run's
first lines. `is_gpu_failure` picks out errors of the GPU itself (a device lost after a laptop slept, an illegal
access, a launch failure; not out-of-memory, which the trainer recovers from), and `gpu_failure` makes the RunFailed
that ends such a run as "interrupted", with the step it goes on from (`unexpected_failure`: the RunFailed of any
error the run did not expect).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from hone.core import events
from hone.core.config import OutputConfig
from hone.core.train.checkpoints import latest_checkpoint

# What CUDA's errors say when the GPU itself failed or went away (lower case; torch raises them as RuntimeError, as
# torch.AcceleratorError since 2.8). A device-side assert is often a bug in a kernel's input, and says so on resume.
GPU_FAILURE_MARKERS = (
    "cuda error",
    "cuda driver error",
    "illegal memory access",
    "illegal instruction",
    "device-side assert",
    "unspecified launch failure",
    "launch timed out",
    "device not ready",
    "no cuda-capable device",
    "cuda-capable device(s) is/are busy or unavailable",
    "uncorrectable ecc error",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
)


class CheckpointClock:
    """When a checkpoint by time is due: `minutes` of training since the last checkpoint or the loop's start (0 =
    never). Time spent paused does not count. `now` is a monotonic clock in seconds (the trainer's, so a test can
    set one)."""

    def __init__(self, minutes: float, now: Callable[[], float] = time.monotonic):
        self.every_s = minutes * 60.0
        self.now = now
        self.since = now()

    def due(self) -> bool:
        return self.every_s > 0 and self.now() - self.since >= self.every_s

    def saved(self) -> None:
        self.since = self.now()

    def paused_for(self, seconds: float) -> None:
        self.since += seconds


def checkpoint_notice(output: OutputConfig) -> events.Notice:
    """The run's first lines: when it saves, and what a kill would cost."""
    minutes, every = output.checkpoint_minutes, output.checkpoint_every
    when = [f"every {minutes:g} minutes of training"] if minutes else []
    when += [f"every {every} steps"] if every else []
    if not when:
        return events.Notice(
            topic="checkpoints",
            level="warning",
            message=(
                "checkpoints only at the end and on a stop (output.checkpoint_minutes = 0, output.checkpoint_every = "
                "0): a kill -9, a crash or a power cut loses the whole run"
            ),
        )
    cost = f"a kill costs at most {minutes:g} minutes" if minutes else f"a kill costs at most {every} steps"
    return events.Notice(
        topic="checkpoints",
        message=(
            f"checkpoints {' and '.join(when)}, and at the end (output.checkpoint_minutes, "
            f"output.checkpoint_every): {cost}"
        ),
    )


def is_gpu_failure(error: BaseException) -> bool:
    """Whether `error` is the GPU failing or going away (not out-of-memory, which a smaller micro-batch may fix)."""
    if isinstance(error, torch.OutOfMemoryError) or not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    if "out of memory" in text:
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch 2.8 and later
    return (accelerator_error is not None and isinstance(error, accelerator_error)) or any(
        marker in text for marker in GPU_FAILURE_MARKERS
    )


def _host_out_of_memory(error: BaseException) -> bool:
    """torch's CPU allocator failing (Linux, Windows); an out-of-memory kill by the system cannot be caught."""
    text = str(error)
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and ("DefaultCPUAllocator" in text or "not enough memory" in text)
    )


def unexpected_failure(error: BaseException, step: int, run_dir: Path | None, details: str) -> events.RunFailed:
    """The RunFailed of an error no part of the run turned into a HoneError, after `step` steps: a GPU that failed
    (`gpu_failure`), the computer out of memory, or anything else (its traceback, `details`, goes to train.log)."""
    if is_gpu_failure(error):
        return gpu_failure(error, step, run_dir, details)
    if _host_out_of_memory(error):
        reason, advice = (
            f"the computer ran out of memory at step {step} ({error})",
            "lower train.batch_tokens or set speed.checkpoint = gpu (recompute); "
            "`hone plan RUN.toml` shows what a step needs",
        )
    else:
        reason, advice = f"{type(error).__name__}: {error}", "see train.log in the run folder for the full traceback"
    return events.RunFailed(reason=reason, advice=advice, step=step, details=details)


def gpu_failure(error: BaseException, step: int, run_dir: Path | None, details: str = "") -> events.RunFailed:
    """The RunFailed of a run whose GPU failed after `step` steps: "interrupted", with the step it goes on from
    (its newest complete checkpoint in `run_dir`; 0 when none, or `run_dir` is unknown to this process)."""
    said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    newest = latest_checkpoint(run_dir) if run_dir is not None else None
    from_step = int(newest.name.rsplit("-", 1)[1]) if newest is not None else 0
    where = str(run_dir) if run_dir is not None else "RUN_DIR"
    go_on = (
        f"The run can go on from step {from_step}, its last complete checkpoint: `hone train --resume {where}`"
        if from_step
        else f"It has no complete checkpoint yet: `hone train --resume {where}` starts it again from step 0"
    )
    return events.RunFailed(
        reason=f"the GPU stopped working at step {step + 1} ({said})",
        advice=(
            f"{go_on}. After a laptop slept or the driver reset, restart Hone Studio (or the computer) first so the "
            "GPU is found again; if it happens again at the same step, see train.log for the full error"
        ),
        step=step,
        details=details,
        interrupted=True,
    )

"""A background job's failure in words the window shows: what went wrong, what to do, and the traceback for the log.
Free of Qt, so that the Studio's helper process (hone.app.helper_process) describes its failures the same way."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from hone.core.errors import HoneError

OOM_ADVICE = (
    "use fewer tokens per batch (Train > train.batch_tokens), turn on activation offload "
    "(speed.checkpoint = offload), or load the base in 4-bit (lora.qlora)"
)


@dataclass(frozen=True)
class TaskError:
    """A task's failure, ready to show: what went wrong, what to do, and the traceback for the log."""

    message: str
    advice: str = ""
    details: str = ""


class RemoteTaskError(Exception):
    """A job that failed in the helper process, carrying the TaskError it was described as there."""

    def __init__(self, error: TaskError):
        super().__init__(error.message)
        self.error = error


def describe_exception(error: BaseException) -> TaskError:
    """A HoneError keeps its message and advice; anything else gets its type and, for out-of-memory, advice."""
    if isinstance(error, RemoteTaskError):
        return error.error
    details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if isinstance(error, HoneError):
        return TaskError(error.message, error.advice, details)
    message = f"{type(error).__name__}: {error}"
    return TaskError(message, advice_for(message), details)


def advice_for(reason: str) -> str:
    """Concrete advice for failures core did not explain itself."""
    lowered = reason.lower()
    if "out of memory" in lowered or "outofmemory" in lowered:
        return OOM_ADVICE
    return ""

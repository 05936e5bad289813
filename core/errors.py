"""Errors meant for people: a one-line message plus concrete advice, shown without a traceback."""

from __future__ import annotations

import json
import os

# How to add bitsandbytes (QLoRA, the 8-bit optimizer): Hone's `gpu` extra, which pins the versions Hone supports.
INSTALL_BITSANDBYTES = 'pip install "hone-studio[gpu]" (bitsandbytes, NVIDIA GPUs only)'


class HoneError(Exception):
    """A problem the user can fix. `message` says what is wrong, `advice` what to do about it; `code` names the kind
    of problem for a front end that offers the fix itself (RunFailed carries it), "" for most."""

    code = ""

    def __init__(self, message: str, advice: str = ""):
        super().__init__(message)
        self.message = message
        self.advice = advice

    def __str__(self) -> str:
        return f"{self.message} — {self.advice}" if self.advice else self.message


# A caller running `hone` as a child process names a file here; a HoneError that ends the command is written to
# it as JSON, so its code (a failure the caller offers to fix itself) survives the process boundary.
FAILURE_FILE_ENV = "HONE_FAILURE_FILE"


def record_failure(error: HoneError) -> None:
    """Write `error` (message, advice, code) to the file FAILURE_FILE_ENV names, if it names one."""
    path = os.environ.get(FAILURE_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"message": error.message, "advice": error.advice, "code": error.code}, f)
    except OSError:
        pass  # the caller falls back to the command's last message


def recorded_failure(path: str | os.PathLike) -> dict | None:
    """What `record_failure` wrote to `path`, or None (nothing written, or not readable)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class ConfigError(HoneError):
    """A RunConfig field has a value that cannot work; the message names the field."""


class DataError(HoneError):
    """A dataset file, row or field cannot be used; the message names file, row and field."""


class ModelError(HoneError):
    """A model cannot be found, downloaded or loaded."""

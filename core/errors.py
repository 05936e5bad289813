"""Errors meant for people: a one-line message plus concrete advice, shown without a traceback."""

from __future__ import annotations

import json
import os
import stat

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
# it as JSON, so its code (a failure the caller offers to fix itself) survives the process boundary. Internal: the
# file is one the caller has not made yet (or an empty one), so a stray value never overwrites a user's file.
FAILURE_FILE_ENV = "HONE_FAILURE_FILE"


def record_failure(error: HoneError) -> None:
    """Write `error` (message, advice, code) to the file FAILURE_FILE_ENV names, if it names one that is new or an
    empty regular file (never through a link, never over a file with content, never into a FIFO or device)."""
    path = os.environ.get(FAILURE_FILE_ENV, "").strip()
    if not path:
        return
    fd = _open_new_or_empty(path)
    if fd is None:
        return  # not a file Hone made: the caller falls back to the command's last message
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"message": error.message, "advice": error.advice, "code": error.code}, f)
    except OSError:
        pass  # a full disk: the caller falls back to the command's last message


def _open_new_or_empty(path: str) -> int | None:
    """A descriptor to write `path`: created here (O_EXCL), or an existing empty regular file; None otherwise."""
    # O_NOFOLLOW: a link is refused; O_NONBLOCK: a FIFO without a reader fails at once instead of hanging.
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_size == 0:
        return fd
    os.close(fd)
    return None


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

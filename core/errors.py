"""Errors meant for people: a one-line message plus concrete advice, shown without a traceback."""

from __future__ import annotations

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


class ConfigError(HoneError):
    """A RunConfig field has a value that cannot work; the message names the field."""


class DataError(HoneError):
    """A dataset file, row or field cannot be used; the message names file, row and field."""


class ModelError(HoneError):
    """A model cannot be found, downloaded or loaded."""

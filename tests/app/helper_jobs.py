"""Jobs for tests/app/test_helper_process.py, importable by the helper process (which runs module-level functions)."""

from __future__ import annotations

import os
import signal
import time

from hone.core.errors import ConfigError


def count_up(n: int, progress) -> dict:
    for i in range(n):
        progress(i)
    return {"pid": os.getpid(), "niceness": os.nice(0) if hasattr(os, "nice") else 0, "n": n}


def refuse(what: str) -> None:
    raise ConfigError(f"{what} cannot be read", "pick another")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def sleep_then_return(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def environment(name: str) -> str | None:
    return os.environ.get(name)

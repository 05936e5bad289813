"""Pause / resume / stop for a running trainer, safe to call from any thread (the GUI's, a signal handler), and the
checked reading of the HONE_* environment variables that steer a run.

The trainer checks the switches between optimizer steps, so a step is never cut in half. HONE_* variables are read
through `env_text`, `env_int` and `check_control_file` (HONE_MOE_BACKEND where its config field is checked): a value
Hone cannot use is a HoneError naming the variable, its value and what it accepts, never a traceback or a default.
"""

from __future__ import annotations

import os
import stat
import threading
import time

from hone.core.errors import HoneError

# A run in a process of its own (hone.core.train.child_run) pauses while this file exists (`follow_pause_file`).
PAUSE_FILE_ENV = "HONE_PAUSE_FILE"
PAUSE_POLL_S = 0.5
# ... and stops after its current step, saving, once this file exists (`hone.core.cli.launch.watch_stop_file`): how
# a launcher or a Studio asks a run to stop where there is no SIGINT to send (Windows), or for every process at once.
STOP_FILE_ENV = "HONE_STOP_FILE"


class RunControl:
    """Thread-safe switches the trainer reads between steps."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()
        self._stop = threading.Event()
        self._detached = threading.Event()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        """Ask the run to stop after the current step; it saves a checkpoint and the adapter first."""
        self._stop.set()
        self._running.set()  # a paused run must wake up to stop

    def detach(self) -> None:
        """Stop reading a run that trains in another process (hone.core.train.child_run); the run goes on."""
        self._detached.set()

    @property
    def detached(self) -> bool:
        return self._detached.is_set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def wait_while_paused(self, timeout: float | None = None) -> bool:
        """Block while paused; True once running (or stopping), False if `timeout` passed first."""
        return self._running.wait(timeout)


def env_text(name: str) -> str | None:
    """The variable's value without surrounding blanks; None when it is unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def env_error(name: str, value: str, accepts: str) -> HoneError:
    """The HoneError for a HONE_* variable whose value Hone cannot use."""
    return HoneError(
        f"the environment variable {name}={value!r} cannot be used: it takes {accepts}",
        f"set {name} to {accepts}, or unset it (`unset {name}`, or remove it from the launcher's environment)",
    )


def env_int(name: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """A whole number from `minimum` to `maximum` (no bound when None); None when unset."""
    value = env_text(name)
    if value is None:
        return None
    top = f" to {maximum}" if maximum is not None else " or more"
    try:
        number = int(value, 10)
    except ValueError:
        raise env_error(name, value, f"a whole number from {minimum}{top}") from None
    if number < minimum or (maximum is not None and number > maximum):
        raise env_error(name, value, f"a whole number from {minimum}{top}")
    return number


def check_control_file(name: str, value: str | None) -> str | None:
    """`value` of variable `name` when it can be the path of a file Hone's own processes create to talk to a child
    (pause, stop): an absolute path in an existing folder, and not anything that exists other than a regular file
    (`/`, a device, a FIFO, a link). None when unset or blank. These variables are internal: the Studio and `hone
    train --gpus N` set them."""
    value = (value or "").strip() or None
    if value is None:
        return None
    accepts = "the path of a file Hone creates (an absolute path in an existing folder; it is internal: unset it)"
    folder = os.path.dirname(value)
    if not os.path.isabs(value) or not os.path.isdir(folder):
        raise env_error(name, value, accepts)
    try:
        mode = os.lstat(value).st_mode
    except FileNotFoundError:
        return value
    except OSError:
        raise env_error(name, value, accepts) from None
    if not stat.S_ISREG(mode):
        raise env_error(name, value, accepts)
    return value


def follow_pause_file(control: RunControl, path: str | None) -> threading.Thread | None:
    """Pause `control` while `path` exists and resume it once the file is gone (checked every PAUSE_POLL_S
    seconds, until the run is asked to stop): how the studio pauses a run that trains in another process.

    Raises:
        HoneError: `path` (PAUSE_FILE_ENV's value) cannot be a file Hone creates (`check_control_file`).
    """
    path = check_control_file(PAUSE_FILE_ENV, path)
    if not path:
        return None

    def follow() -> None:
        while not control.stop_requested:
            exists = os.path.isfile(path) and not os.path.islink(path)  # only a file Hone makes pauses
            if exists and not control.paused:
                control.pause()
            elif not exists and control.paused:
                control.resume()
            time.sleep(PAUSE_POLL_S)

    thread = threading.Thread(target=follow, name="hone-pause-file", daemon=True)
    thread.start()
    return thread

"""Pause / resume / stop for a running trainer, safe to call from any thread (the GUI's, a signal handler).

The trainer checks it between optimizer steps, so a step is never cut in half.
"""

from __future__ import annotations

import os
import threading
import time

# A run in a process of its own (hone.core.train.child_run) pauses while this file exists (`follow_pause_file`).
PAUSE_FILE_ENV = "HONE_PAUSE_FILE"
PAUSE_POLL_S = 0.5


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


def follow_pause_file(control: RunControl, path: str | None) -> threading.Thread | None:
    """Pause `control` while `path` exists and resume it once the file is gone (checked every PAUSE_POLL_S
    seconds, until the run is asked to stop): how the studio pauses a run that trains in another process."""
    if not path:
        return None

    def follow() -> None:
        while not control.stop_requested:
            exists = os.path.exists(path)
            if exists and not control.paused:
                control.pause()
            elif not exists and control.paused:
                control.resume()
            time.sleep(PAUSE_POLL_S)

    thread = threading.Thread(target=follow, name="hone-pause-file", daemon=True)
    thread.start()
    return thread

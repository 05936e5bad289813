"""Pause / resume / stop for a running trainer, safe to call from any thread (the GUI's, a signal handler).

The trainer checks it between optimizer steps, so a step is never cut in half.
"""

from __future__ import annotations

import threading


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

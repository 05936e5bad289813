"""The Monitor's reading of a run folder: a past run replayed, a run another process trains followed, and the
smoothed loss, all without stalling the window.

A run's metrics.jsonl can hold a million steps (450 MB). `FolderReplay` reads it with the Monitor's column reader
(hone.core.api.MethodColumnsReader: numpy columns for the steps, events for the rest) on a Task's thread
when it is large, and hands each chunk it read to the page as it comes, a slice per timer tick, so the window keeps
answering and the page takes in the first steps while the rest is read; a small file is read at once, and the page
is complete as soon as it opens. Following reads only what was appended since the last read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, QTimer, Signal

from hone.app.workers import Task

# A metrics.jsonl up to this size is read on the GUI thread, so the page is whole the moment it opens: two chunks of
# the column reader, about 27,000 steps in some 80 ms (or a damaged file whose one line of megabytes is skipped
# unread); a larger one on a Task's thread.
READ_NOW_BYTES = 16 << 20
# GUI time per timer tick for taking in what was read: well under the 100 ms in which a window still feels at hand.
APPLY_BUDGET_S = 0.02
# Points smoothed together in `SmoothedLoss.extend`: beta**-64 stays far inside float64 for any beta of use (0.5**-64
# is 1.8e19), and a million points are 16,000 blocks.
SMOOTH_BLOCK = 64
# Room made for the steps a large file is guessed to hold (from its first chunk's lines per byte), with this much
# to spare: lines of a run grow a little longer as its numbers do, and growing a million-point buffer later copies it.
RESERVE_MARGIN = 1.05


class SmoothedLoss:
    """Exponential moving average with bias correction: value_n = EMA_n / (1 - beta^n)."""

    def __init__(self, beta: float):
        self.beta = beta
        self._ema = 0.0
        self._n = 0

    def add(self, value: float) -> float:
        self._n += 1
        self._ema = self.beta * self._ema + (1 - self.beta) * value
        return self._ema / (1 - self.beta**self._n)

    def extend(self, values: np.ndarray) -> np.ndarray:
        """`add` for each value in turn, vectorized: a million losses in milliseconds. (n,) float64 -> (n,)."""
        values = np.asarray(values, dtype=np.float64)
        n = len(values)
        if n == 0:
            return np.zeros(0)
        b = self.beta
        blocks = -(-n // SMOOTH_BLOCK)
        padded = np.zeros(blocks * SMOOTH_BLOCK)
        padded[:n] = values
        j = np.arange(SMOOTH_BLOCK)
        # Within a block, from a zero start: (1-b) * sum_{i<=j} b^(j-i) x_i = (1-b) b^j cumsum(x_i b^-i).
        local = np.cumsum(padded.reshape(blocks, SMOOTH_BLOCK) * b**-j, axis=1) * (b**j * (1 - b))
        # Each block starts from the EMA where the block before it ended: a recurrence over blocks only.
        carry = np.empty(blocks)
        ema = self._ema
        decay = b**SMOOTH_BLOCK
        for r, end in enumerate(local[:, -1].tolist()):
            carry[r] = ema
            ema = end + decay * ema
        ema_all = (local + carry[:, None] * b ** (j + 1)).ravel()[:n]
        self._ema = float(ema_all[-1])
        steps = self._n + 1 + np.arange(n)
        self._n += n
        return ema_all / (1 - b ** steps.astype(np.float64))


class FolderReplay(QObject):
    """Reads a run folder's metrics.jsonl into the page through `take(item, last_of_run)`: an event, or the
    StepColumns of a run of steps (`last_of_run`: no more steps follow it in what was read, so the page logs its last
    steps). `done` comes when all that was read is taken in."""

    done = Signal()

    def __init__(
        self,
        take: Callable[[object, bool], None],
        reserve: Callable[[int], None] | None = None,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self._take = take
        self._reserve = reserve  # told how many steps a large read holds before they are taken in
        self.reader = None
        self._queue: deque = deque()
        self._token = 0  # a read whose result comes after cancel() or another start() is dropped
        self.reading = False
        self._size = 0  # bytes of the file a large read reads
        self._reserved = False
        self._timer = QTimer(self)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self._apply_some)

    @property
    def large(self) -> bool:
        """The last read was of a large file, on a Task's thread."""
        return self._size > 0

    @property
    def busy(self) -> bool:
        """Reading, or taking in what was read."""
        return self.reading or bool(self._queue)

    def start(self, run_dir: str | Path) -> None:
        """Read the folder's metrics.jsonl from its start: at once when small, else on a Task's thread."""
        from hone.core.api import METRICS_FILE, MethodColumnsReader

        self.cancel()
        self.reader = reader = MethodColumnsReader(run_dir)
        try:
            size = (Path(run_dir) / METRICS_FILE).stat().st_size
        except OSError:
            size = 0
        self._size = 0
        if size <= READ_NOW_BYTES:
            self._queue.extend(reader.read())
            self._apply_some(budget_s=None)
            return
        self.reading = True
        self._size = size
        self._reserved = False
        token = self._token

        def read(progress) -> None:
            reader.read_into(lambda items: progress((reader.offset, items)))

        Task(
            read,
            on_progress=lambda got: self._got(token, *got),
            on_result=lambda _: self._read_all(token),
            on_error=lambda _: self._read_all(token),  # what was read is shown (the reader itself never raises)
        )

    def read_more(self) -> bool:
        """Take in what the file gained since the last read (following a run); False when nothing came."""
        if self.reader is None or self.busy:
            return False
        items = self.reader.read()
        self._queue.extend(items)
        self._apply_some(budget_s=None)
        return bool(items)

    def cancel(self) -> None:
        self._token += 1
        self._queue.clear()
        self._timer.stop()
        self.reading = False

    def _got(self, token: int, offset: int, items: list) -> None:
        """A chunk's items, read on the Task's thread (`offset`: how far into the file it has read)."""
        from hone.core.api import StepColumns

        if token != self._token:
            return
        if not self._reserved and self._reserve is not None and offset:
            steps = sum(len(item) for item in items if isinstance(item, StepColumns))
            if steps:  # the whole file's steps, guessed from the first chunk that holds some
                self._reserved = True
                self._reserve(int(steps * self._size / offset * RESERVE_MARGIN))
        self._queue.extend(items)
        self._apply_some()

    def _read_all(self, token: int) -> None:
        if token != self._token:
            return
        self.reading = False
        self._apply_some()

    def _apply_some(self, budget_s: float | None = APPLY_BUDGET_S) -> None:
        """Take in queued items for at most `budget_s` of GUI time (None: all), then come back on the next tick."""
        from hone.core.api import StepColumns

        began = time.monotonic()
        while self._queue and (budget_s is None or time.monotonic() - began < budget_s):
            steps = isinstance(self._queue[0], StepColumns)
            if steps and len(self._queue) == 1 and self.reading:
                break  # whether more steps follow it (for the log's step lines) is known with the next chunk
            item = self._queue.popleft()
            last = steps and not (self._queue and isinstance(self._queue[0], StepColumns))
            self._take(item, last)
        if self._queue and not (self.reading and len(self._queue) == 1 and isinstance(self._queue[0], StepColumns)):
            self._timer.start()
        else:
            self._timer.stop()
            if not self.busy:
                self.done.emit()

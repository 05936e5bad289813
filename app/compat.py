"""Workarounds for bugs in the GUI libraries, each detected at run time and inert where the bug is absent."""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, QTimer

# None's reference count is kept at least this high while the leak below is present: far above what the GUI can
# leak between two top-ups (a busy window makes a few thousand calls a second), costing 8 bytes per reference.
NONE_REFCOUNT_FLOOR = 1_000_000
TOP_UP_INTERVAL_MS = 250


def leaks_none_references() -> bool:
    """True when PySide6 drops a reference to None on each call of a method that returns nothing.

    PySide6 6.12.0 does this on Python 3.10/3.11 (from 3.12 on, None is immortal and the count does not matter).
    Left alone, None's count reaches zero after some thousands of calls and the interpreter aborts
    ("none_dealloc"), typically while pyqtgraph paints a chart.
    """
    if sys.version_info >= (3, 12):
        return False
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(200):
        probe.blockSignals(False)  # a method that returns a value (bool) ...
        probe.setObjectName("probe")  # ... and one that returns nothing
    return before - sys.getrefcount(None) >= 100


class NoneReferenceGuard(QObject):
    """Keeps None's reference count above NONE_REFCOUNT_FLOOR by holding extra references, topped up on a timer
    on the GUI thread. Started only when `leaks_none_references()`; the real fix is a PySide6 without the bug."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._held: list[None] = []
        # The held references must outlive the interpreter's own teardown: each stands in for one PySide6 lost, so
        # releasing them at exit would take None's count to zero all the same. The list is never freed.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._held))
        self._timer = QTimer(self)
        self._timer.setInterval(TOP_UP_INTERVAL_MS)
        self._timer.timeout.connect(self.top_up)
        self.top_up()
        self._timer.start()

    def top_up(self) -> None:
        missing = NONE_REFCOUNT_FLOOR - sys.getrefcount(None)
        if missing > 0:
            self._held.extend([None] * missing)

    @property
    def held(self) -> int:
        return len(self._held)


def install_guards(app: QObject) -> NoneReferenceGuard | None:
    """Start the workarounds this PySide6 needs (once per application)."""
    guard = app.property("hone_none_guard")
    if isinstance(guard, NoneReferenceGuard):
        return guard
    if not leaks_none_references():
        return None
    guard = NoneReferenceGuard(app)
    app.setProperty("hone_none_guard", guard)
    return guard

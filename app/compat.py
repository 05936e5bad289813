"""Workarounds for bugs in the GUI libraries, each detected at run time and inert where the bug is absent."""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, QTimer

# Each affected singleton's reference count is kept at least this high: far above what the GUI can leak between
# two top-ups (a busy window makes a few thousand calls a second), at 8 bytes per held reference.
REFCOUNT_FLOOR = 1_000_000
TOP_UP_INTERVAL_MS = 250
SINGLETONS = (None, True, False)


def leaked_singletons() -> tuple:
    """The singletons to guard: None, True and False when PySide6 drops references to None on each call of a
    method that returns nothing, else none.

    PySide6 6.12.0 does this on Python 3.10/3.11 (from 3.12 on these objects are immortal and the count does not
    matter); the same build also loses references to True and False on paths too indirect to probe cheaply
    (pyqtgraph's painting hits them). Left alone, a count reaches zero after some thousands of calls and the
    interpreter aborts ("none_dealloc", "bool_dealloc").
    """
    if sys.version_info >= (3, 12):
        return ()
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(200):
        probe.setObjectName("probe")  # returns nothing
    return SINGLETONS if before - sys.getrefcount(None) >= 100 else ()


class ReferenceGuard(QObject):
    """Keeps the reference counts of `singletons` above REFCOUNT_FLOOR by holding extra references, topped up on
    a timer on the GUI thread. Started only where PySide6 leaks; the real fix is a PySide6 without the bug."""

    def __init__(self, singletons: tuple, parent: QObject | None = None):
        super().__init__(parent)
        self.singletons = singletons
        self._held: dict[int, list] = {id(s): [] for s in singletons}
        # The held references must outlive the interpreter's own teardown: each stands in for one PySide6 lost, so
        # releasing them at exit would take the count to zero all the same. These lists are never freed.
        for held in self._held.values():
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
        self._timer = QTimer(self)
        self._timer.setInterval(TOP_UP_INTERVAL_MS)
        self._timer.timeout.connect(self.top_up)
        self.top_up()
        self._timer.start()

    def top_up(self) -> None:
        for singleton in self.singletons:
            missing = REFCOUNT_FLOOR - sys.getrefcount(singleton)
            if missing > 0:
                self._held[id(singleton)].extend([singleton] * missing)

    def held(self, singleton) -> int:
        return len(self._held.get(id(singleton), ()))


def install_guards(app: QObject) -> ReferenceGuard | None:
    """Start the workarounds this PySide6 needs (once per application)."""
    guard = app.property("hone_reference_guard")
    if isinstance(guard, ReferenceGuard):
        return guard
    leaked = leaked_singletons()
    if not leaked:
        return None
    guard = ReferenceGuard(leaked, app)
    app.setProperty("hone_reference_guard", guard)
    return guard

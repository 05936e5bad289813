"""Python's cyclic garbage collection on the GUI thread only, while a Studio window is open.

Automatic collection runs in whichever thread happens to allocate past Python's threshold. When that is a worker
thread (a Task reading a model) and the garbage holds Qt objects, their C++ destructors run on it: one took a Qt
connection lock and waited for the interpreter lock, while the GUI thread held the interpreter lock and waited for
that Qt lock in another object's destructor. Neither moved again, and the window stayed frozen for good. While a
window is open, automatic collection is off and a timer on the GUI thread collects the generation Python's own
thresholds ask for, so garbage goes as often as before and always on this thread.

A full collection walks every tracked object (~60 ms once the window's pages are built), so what is alive once the
first window has shown is frozen out of later walks (gc.freeze): it lives as long as the window anyway.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QTimer

INTERVAL_MS = 200  # how often the GUI thread looks at the counts (a look costs microseconds)

_holders = 0
_enabled_before = True
_timer: QTimer | None = None
_frozen = False


def collect_due() -> int | None:
    """Collect the oldest generation whose count passed its threshold, as automatic collection would; which one."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    for generation in (2, 1, 0):
        if thresholds[0] and counts[generation] > thresholds[generation]:
            gc.collect(generation)
            return generation
    return None


def collect_on_gui_thread() -> Callable[[], None]:
    """Turn automatic collection off and collect on a GUI-thread timer instead, until the returned release is
    called as often as this was (one per window). Call it on the GUI thread, with the QApplication made."""
    global _holders, _enabled_before, _timer
    if _holders == 0:
        _enabled_before = gc.isenabled()
        gc.disable()
        _timer = QTimer(QCoreApplication.instance())
        _timer.setInterval(INTERVAL_MS)
        _timer.timeout.connect(collect_due)
        _timer.start()
        QTimer.singleShot(0, _freeze_startup_heap)  # once the window that asked has been built and shown
    _holders += 1
    released = False

    def release() -> None:
        global _holders, _timer
        nonlocal released
        if released:
            return
        released = True
        _holders -= 1
        if _holders == 0:
            if _timer is not None:
                _timer.stop()
                _timer.deleteLater()
                _timer = None
            if _enabled_before:
                gc.enable()

    return release


def _freeze_startup_heap() -> None:
    """Move every object alive now into the permanent generation, once per process: full collections then walk only
    what was made later. The garbage among them goes first, so none is kept for good."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()


def is_holding() -> bool:
    return _holders > 0

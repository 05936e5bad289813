"""The guard against PySide6 dropping references to None, True and False keeps a busy window alive where the
bug exists (PySide6 6.12.0 on Python < 3.12), and does nothing elsewhere."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject

from hone.app.compat import REFCOUNT_FLOOR, install_guards, leaked_singletons


def test_leaky_calls_cannot_exhaust_the_singletons(qtbot, qapp):
    guard = install_guards(qapp)
    probe = QObject()
    before = sys.getrefcount(None), sys.getrefcount(False)
    for _ in range(1000):
        probe.setObjectName("x")
        probe.signalsBlocked()
    leaked = before[0] - sys.getrefcount(None), before[1] - sys.getrefcount(False)
    assert (leaked_singletons() != ()) == (leaked[0] >= 500)
    if guard is None:
        assert leaked[0] < 500
        return
    assert set(guard.singletons) == {None, True, False}
    # far more calls than the objects had references before the guard: without it the interpreter would abort
    for _ in range(3):
        for _ in range(2 * REFCOUNT_FLOOR // 10):
            probe.setObjectName("x")
            probe.signalsBlocked()
        qtbot.wait(500)
    for singleton in guard.singletons:
        assert sys.getrefcount(singleton) >= REFCOUNT_FLOOR * 0.5, singleton
        assert guard.held(singleton) >= REFCOUNT_FLOOR * 0.5, singleton
    assert install_guards(qapp) is guard, "one guard per application"

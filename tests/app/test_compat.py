"""The guard against PySide6 dropping references to None keeps a busy window alive where the bug exists."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject

from hone.app.compat import NONE_REFCOUNT_FLOOR, install_guards, leaks_none_references


def test_void_calls_cannot_exhaust_none(qtbot, qapp):
    guard = install_guards(qapp)
    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(1000):
        probe.setObjectName("x")
    leaked = before - sys.getrefcount(None)
    assert leaks_none_references() == (leaked >= 500)
    if guard is None:
        assert leaked < 500
        return
    # far more calls than None had references before the guard: without it the interpreter would abort
    for _ in range(3):
        for _ in range(2 * NONE_REFCOUNT_FLOOR // 10):
            probe.setObjectName("x")
        qtbot.wait(2 * 250)
    assert sys.getrefcount(None) >= NONE_REFCOUNT_FLOOR * 0.5
    assert guard.held >= NONE_REFCOUNT_FLOOR * 0.5
    assert install_guards(qapp) is guard, "one guard per application"

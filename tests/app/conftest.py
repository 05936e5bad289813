"""Fixtures for the Studio's tests: settings in a temporary INI file (never the user's), a runs folder under
tmp_path, and a main window built the way `hone studio` builds it."""

from __future__ import annotations

import time

import pytest

# Machines without the desktop stack (a headless GPU box) skip the Studio's tests instead of failing to collect them.
pytest.importorskip("PySide6", reason="the Studio's tests need PySide6 (pip install pyside6-essentials)")


@pytest.fixture
def settings(tmp_path):
    from PySide6.QtCore import QSettings

    from hone.app.settings import Settings

    s = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    config = s.config()
    config.output.runs_dir = str(tmp_path / "runs")
    s.set_config(config)
    return s


_MODAL_STATICS = {
    "QMessageBox": ("question", "warning", "critical", "information", "about"),
    "QInputDialog": ("getInt", "getDouble", "getText", "getMultiLineText", "getItem"),
    "QFileDialog": ("getOpenFileName", "getOpenFileNames", "getExistingDirectory", "getSaveFileName"),
}


@pytest.fixture(autouse=True)
def no_unexpected_modal_dialogs(monkeypatch):
    """A modal dialog waits for a click that never comes under the offscreen platform, so a test that opened one
    would hang the whole suite. Opening one fails the test at once with the dialog's words instead; a test that
    expects a dialog replaces it with monkeypatch, which overrides this."""
    from PySide6 import QtWidgets

    def refuse(what: str, words: str):
        raise AssertionError(f"the test opened a modal dialog ({what}) that nobody can answer: {words}")

    for name, functions in _MODAL_STATICS.items():
        cls = getattr(QtWidgets, name)
        for function in functions:
            monkeypatch.setattr(
                cls,
                function,
                staticmethod(lambda *a, _w=f"{name}.{function}", **_k: refuse(_w, " / ".join(map(str, a[1:3])))),
            )

    def exec_(dialog, *_a, **_k):
        words = getattr(dialog, "text", lambda: "")() if isinstance(dialog, QtWidgets.QMessageBox) else ""
        refuse(f"{type(dialog).__name__}.exec", f"{dialog.windowTitle()} / {words}")

    for cls in (QtWidgets.QDialog, QtWidgets.QMessageBox, QtWidgets.QInputDialog, QtWidgets.QFileDialog):
        monkeypatch.setattr(cls, "exec", exec_)


def settle_tasks(qtbot, timeout_ms: int = 10_000) -> None:
    """Run the event loop until the window's background Tasks (machine detection, data checks, exports) have ended,
    at most `timeout_ms`.

    Call it before closing a window. A Task's thread quits through a call queued to this (the GUI) thread, and
    MainWindow.closeEvent blocks this thread in Task.wait(10 s): a window closed right after a Task's work ended
    would sit out those 10 s with nothing left to do.
    """
    from hone.app.workers import Task

    deadline = time.monotonic() + timeout_ms / 1000
    while Task.running() and time.monotonic() < deadline:
        qtbot.wait(10)


@pytest.fixture
def make_window(qtbot, settings):
    """Factory: make_window(**kwargs) -> MainWindow (shown, closed at the end of the test)."""
    from hone.app.window import MainWindow

    made = []

    def make(**kwargs):
        kwargs.setdefault("telemetry", False)
        window = MainWindow(settings, **kwargs)  # deletes itself when closed (here, or by the test)
        window.resize(1280, 820)
        window.show()
        made.append(window)
        return window

    yield make
    from shiboken6 import isValid

    for window in made:
        if not isValid(window):  # closed (and so deleted) by the test itself
            continue
        session = window.state.session
        if session.is_running:
            session.stop()
            # Not session.wait(): like a Task's (settle_tasks), the run's thread quits through a call queued to this
            # thread, so a blocking wait here sat out its whole timeout after every run that had just finished.
            qtbot.waitUntil(lambda s=session: not s.is_running, timeout=60_000)
        settle_tasks(qtbot)
        window.close()


@pytest.fixture
def window(make_window):
    return make_window()

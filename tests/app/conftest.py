"""Fixtures for the Studio's tests: settings in a temporary INI file (never the user's), a runs folder under
tmp_path, and a main window built the way `hone studio` builds it."""

from __future__ import annotations

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
        if window.state.session.is_running:
            window.state.session.stop()
            window.state.session.wait(30_000)
            qtbot.waitUntil(lambda w=window: not w.state.session.is_running, timeout=30_000)
        window.close()


@pytest.fixture
def window(make_window):
    return make_window()

"""A run's whole train.log opens from the Monitor and the Runs page: read off the GUI thread (the window keeps
answering while a large log loads), the last LOG_VIEW_LIMIT bytes shown with a line that says so, find next and
previous (case-insensitive, the match highlighted), Copy all, and Open in the system's editor."""

from __future__ import annotations

import time
from itertools import pairwise

import pytest
from PySide6.QtCore import QTimer, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor

from hone.app.widgets import log_viewer
from hone.app.widgets.log_viewer import LogViewer, read_log
from hone.core.config import RunConfig
from hone.core.events import RunFinished, RunStarted, StepMetrics


def _write_run(run_dir, steps: int = 3) -> None:
    """A real run folder (train.log written by the engine's own RunWriter)."""
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(run_dir, RunConfig())
    writer.write(
        RunStarted(
            run_dir=str(run_dir),
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=steps,
            tokens_per_epoch=1,
            time=time.time(),
        )
    )
    for step in range(1, steps + 1):
        writer.write(
            StepMetrics(
                step=step,
                total_steps=steps,
                epoch=0.0,
                loss=2.0 / step,
                lr=1e-4,
                grad_norm=1.0,
                tokens=1,
                trained_tokens=1,
                tokens_per_s=1.0,
                step_time=0.1,
                elapsed=0.1 * step,
            )
        )
    writer.write(RunFinished(step=steps, run_dir=str(run_dir), adapter_dir="", final_loss=2.0 / steps, elapsed=1.0))
    writer.close()


def _opened(qtbot, viewer: LogViewer) -> LogViewer:
    qtbot.addWidget(viewer)
    qtbot.waitUntil(viewer.is_loaded, timeout=60_000)
    return viewer


def test_read_log_keeps_whole_lines_of_the_end_and_says_how_much(tmp_path):
    path = tmp_path / "train.log"
    lines = [f"line {i:04d} " + "x" * 50 for i in range(1000)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    size = path.stat().st_size
    whole = read_log(path, limit=size)
    assert whole.text == path.read_text(encoding="utf-8") and whole.size == size and whole.cut == 0
    part = read_log(path, limit=10_000)
    shown = part.text.splitlines()
    assert shown == lines[-len(shown) :], "whole lines, the last ones, in order"
    assert len(part.text.encode()) <= 10_000 and len(shown) == 10_000 // 61  # 61 bytes a line
    assert part.cut == size - len(part.text.encode())


def test_the_viewer_shows_the_file_finds_copies_and_opens_it(qtbot, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    _write_run(run_dir)
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    viewer = _opened(qtbot, LogViewer(run_dir / "train.log"))
    assert viewer.text.toPlainText() == log.rstrip("\n")
    assert not viewer.note.isVisibleTo(viewer), "nothing cut: no note"

    # find: case-insensitive, next and previous wrap around, the match selected and highlighted
    viewer.search.setText("STEP 3/")
    assert viewer.find_next()
    cursor = viewer.text.textCursor()
    assert cursor.selectedText() == "step 3/"
    assert log[: cursor.selectionStart()].count("\n") == next(
        i for i, line in enumerate(log.splitlines()) if "step 3/3" in line
    )
    assert [s.cursor.selectedText() for s in viewer.text.extraSelections()] == ["step 3/"]
    viewer.search.setText("LoSs")
    matches = log.lower().count("loss")
    assert matches >= 3  # the step lines and the final loss
    viewer.text.moveCursor(QTextCursor.Start)
    positions = []
    for _ in range(matches):
        assert viewer.find_next()
        positions.append(viewer.text.textCursor().selectionStart())
    assert positions == sorted(positions) and len(set(positions)) == matches
    assert [log[p : p + 4] for p in positions] == ["loss"] * matches
    assert viewer.find_next() and viewer.text.textCursor().selectionStart() == positions[0], "wraps to the first"
    assert viewer.find_previous() and viewer.text.textCursor().selectionStart() == positions[-1], "and back"
    viewer.search.setText("no such words")
    assert not viewer.find_next() and "Not found" in viewer.found.text()

    viewer.copy_button.click()
    assert QGuiApplication.clipboard().text() == viewer.text.toPlainText()

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    viewer.editor_button.click()
    assert opened == [QUrl.fromLocalFile(str(run_dir / "train.log"))]


def test_a_large_log_loads_without_freezing_the_window_and_says_what_was_cut(qtbot, tmp_path, monkeypatch):
    monkeypatch.setattr(log_viewer, "LOG_VIEW_LIMIT", 2 * 2**20)
    path = tmp_path / "train.log"
    line = "step 1/1  loss 1.0000  lr 1.00e-04  1 tok/s " + "x" * 60 + "\n"
    count = (6 * 2**20) // len(line)
    path.write_text(line * (count - 1) + "the last line\n", encoding="utf-8")
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    started = time.monotonic()
    viewer = LogViewer(path)
    opened_in = time.monotonic() - started
    _opened(qtbot, viewer)
    timer.stop()
    assert opened_in < 0.2, "the dialog opens at once; the file is read on a worker thread"
    gaps = [b - a for a, b in pairwise(ticks)]
    # a quick machine loads it in a few ticks: what matters is that no tick waited long
    assert ticks and max(gaps, default=0.0) < 0.5, f"the event loop kept running (longest gap {max(gaps):.2f} s)"
    text = viewer.text.toPlainText()
    assert text.endswith("the last line") and len(text.encode()) <= 2 * 2**20
    assert viewer.note.isVisibleTo(viewer)
    assert "The log is 6 MiB: the last 2 MiB are shown" in viewer.note.text()


def test_a_missing_log_says_so(qtbot, tmp_path):
    viewer = _opened(qtbot, LogViewer(tmp_path / "nowhere" / "train.log"))
    assert viewer.note.isVisibleTo(viewer) and "could not be read" in viewer.note.text()
    assert viewer.text.toPlainText() == "" and not viewer.copy_button.isEnabled()


@pytest.mark.parametrize("where", ["monitor", "runs"])
def test_open_full_log_from_the_monitor_and_the_runs_page(qtbot, window, tmp_path, where):
    run_dir = tmp_path / "runs" / "logged"
    _write_run(run_dir)
    if where == "monitor":
        page = window.monitor
        assert not page.log_button.isEnabled(), "no run shown yet"
        with qtbot.waitSignal(page.run_shown, timeout=10_000):
            page.show_run(run_dir)
    else:
        page = window.page("runs")
        page.refresh()
        page.select([0])
    assert page.log_button.isEnabled() and page.log_button.text() == "Open full log"
    page.log_button.click()
    viewer = page.log_viewer
    qtbot.waitUntil(viewer.is_loaded, timeout=60_000)
    assert viewer.isVisible() and viewer.path == run_dir / "train.log"
    assert viewer.text.toPlainText() == (run_dir / "train.log").read_text(encoding="utf-8").rstrip("\n")
    viewer.close()

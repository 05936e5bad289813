"""On Linux every run trains in a process of its own. Started with "Keep training when Hone Studio closes", the
Monitor shows its steps, it pauses and resumes (through a file the child watches), and closing the window with
"Keep training" leaves it training to the end; started without, closing the window asks to stop it, and it stops
and saves before the window closes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from PySide6.QtWidgets import QMessageBox
from shiboken6 import isValid
from test_train_gpus import ready_to_start

from hone.core import events
from hone.core.train.run_dir import read_events


def test_a_background_run_outlives_the_window(qtbot, make_window, tiny_model_dir, monkeypatch):
    window = make_window()
    ready_to_start(window, tiny_model_dir)
    steps = 150
    window.state.update(f"train.max_steps={steps}", "output.checkpoint_every=0")
    page, monitor = window.page("train"), window.page("monitor")
    page.background_box.setChecked(True)
    seen = []
    window.state.session.event.connect(seen.append)
    page.start()
    session = window.state.session
    assert session.in_child and session.can_pause
    trained = lambda: [e for e in seen if isinstance(e, events.StepMetrics)]  # noqa: E731
    qtbot.waitUntil(lambda: bool(trained()), timeout=120_000)
    qtbot.waitUntil(monitor.pause_button.isEnabled, timeout=10_000)
    assert monitor.stop_button.isEnabled()

    monitor.pause_button.click()
    qtbot.waitUntil(lambda: any(isinstance(e, events.RunPaused) for e in seen), timeout=30_000)
    paused_at = len(trained())
    assert paused_at < steps
    qtbot.wait(1500)
    assert len(trained()) == paused_at, "no step runs while paused"
    assert monitor.status_pill.text() == "Paused"
    monitor.pause_button.click()
    qtbot.waitUntil(lambda: len(trained()) > paused_at, timeout=30_000)
    assert any(isinstance(e, events.RunResumed) for e in seen)
    run_dir = next(e.run_dir for e in seen if isinstance(e, events.RunStarted))

    monkeypatch.setattr(window, "ask_keep_on_close", lambda: "keep")
    window.close()  # it closes as soon as it stops reading the run (within a poll), without waiting for the run
    qtbot.waitUntil(lambda: not isValid(window) or not window.isVisible(), timeout=5_000)
    assert not any(isinstance(e, (events.RunFinished, events.RunFailed)) for e in seen)  # nothing made up
    deadline = time.time() + 300
    while time.time() < deadline and not any(isinstance(e, events.RunFinished) for e in read_events(run_dir)):
        time.sleep(0.2)
    finished = read_events(run_dir)[-1]
    assert isinstance(finished, events.RunFinished) and finished.step == steps and not finished.stopped, finished


def test_a_run_without_the_box_trains_in_a_child_and_stops_when_the_window_closes(
    qtbot, make_window, tiny_model_dir, monkeypatch
):
    window = make_window()
    ready_to_start(window, tiny_model_dir)
    window.state.update("train.max_steps=500", "output.checkpoint_every=0")
    seen = []
    window.state.session.event.connect(seen.append)
    window.page("train").start()
    session = window.state.session
    assert session.in_child and not session.outlives_window and session.can_pause
    qtbot.waitUntil(lambda: any(isinstance(e, events.StepMetrics) for e in seen), timeout=120_000)
    run_dir = next(e.run_dir for e in seen if isinstance(e, events.RunStarted))

    asked = []
    monkeypatch.setattr(window, "ask_keep_on_close", lambda: asked.append("keep") or "keep")
    monkeypatch.setattr(window, "ask_stop_on_close", lambda: asked.append("stop") or QMessageBox.Yes)
    window.close()  # asks, stops the run (it saves), then closes
    qtbot.waitUntil(lambda: not isValid(window) or not window.isVisible(), timeout=120_000)
    assert asked == ["stop"]
    finished = [e for e in seen if isinstance(e, events.RunFinished)]
    assert len(finished) == 1 and finished[0].stopped and finished[0].step < 500
    assert json.loads((Path(run_dir) / "run.json").read_text())["status"] == "stopped"
    assert (Path(run_dir) / "adapter").is_dir()

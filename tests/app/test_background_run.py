"""A run started with "Keep training when Hone Studio closes" trains in a process of its own: the Monitor shows
its steps, it pauses and resumes (through a file the child watches), and closing the window with "Keep training"
leaves it training to the end."""

from __future__ import annotations

import time

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

"""A run that another process is training (hone train in a terminal, another window), opened from Runs: the
Monitor shows what is in its metrics.jsonl, then follows it live until it finishes, or says so when the process
ends without finishing. Here a RunWriter held open in the test stands in for that process (it holds the run's lock,
as the trainer does)."""

from __future__ import annotations

import time

from hone.core.config import RunConfig
from hone.core.events import RunFinished
from hone.core.train.run_dir import RunWriter
from tests.app.test_monitor_states import _started, _step


def test_a_run_training_elsewhere_is_followed_until_it_finishes(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "runs" / "elsewhere"
    t0 = time.time()
    writer = RunWriter(run_dir, RunConfig())
    try:
        for event in (_started(run_dir, t0), _step(1, t0)):
            writer.write(event)
        window = make_window()
        window.open_run(str(run_dir))
        monitor = window.monitor
        assert monitor.following == run_dir and monitor.last_step.step == 1
        assert "following live" in monitor.header.subtitle.text()
        writer.write(_step(2, t0))
        qtbot.waitUntil(lambda: monitor.last_step.step == 2, timeout=5000)
        assert list(monitor.loss_chart.points("raw")[0]) == [1, 2]
        writer.write(RunFinished(step=2, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=1.0))
        qtbot.waitUntil(lambda: monitor.following is None, timeout=5000)
        assert monitor.status == "finished"
    finally:
        writer.close()


def test_a_followed_run_whose_process_ends_unfinished_says_so(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "runs" / "killed"
    t0 = time.time()
    writer = RunWriter(run_dir, RunConfig())
    for event in (_started(run_dir, t0), _step(1, t0)):
        writer.write(event)
    window = make_window()
    window.open_run(str(run_dir))
    monitor = window.monitor
    assert monitor.following == run_dir
    writer.close()  # the lock goes with its process: nobody trains the run any more
    qtbot.waitUntil(lambda: monitor.following is None, timeout=5000)
    assert monitor.status == "interrupted", "as Runs lists a run whose process ended before it did"
    assert "ended before the run did" in monitor.log.toPlainText()
    monitor.flush()
    assert monitor.status_pill.text() == "Interrupted" and window.badge.title.text() == "Interrupted"


def test_a_finished_run_is_not_followed(make_window, tmp_path):
    run_dir = tmp_path / "runs" / "done"
    t0 = time.time()
    writer = RunWriter(run_dir, RunConfig())
    for event in (_started(run_dir, t0), _step(1, t0)):
        writer.write(event)
    writer.close()  # stopped long ago, never finished: nothing to follow (Runs shows it as interrupted)
    window = make_window()
    window.open_run(str(run_dir))
    assert window.monitor.following is None

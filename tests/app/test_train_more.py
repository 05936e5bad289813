"""A finished run offers "Train more steps…" instead of a Resume that could only fail on its own max_steps: it goes on
from its last step with train.max_steps raised, and the Monitor keeps the steps already trained on its charts."""

from __future__ import annotations

from pathlib import Path

from test_run_checks import GPU
from test_train_gpus import ready_to_start

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.run_dir import read_events, read_summary


def _train_to_the_end(qtbot, window, tiny_model_dir) -> Path:
    ready_to_start(window, tiny_model_dir)  # two steps
    window.state.update("output.checkpoint_every=0")  # the run's end saves the checkpoint a resume starts from
    seen = []
    window.state.session.event.connect(seen.append)
    window.page("train").start()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=180_000)
    finished = [e for e in seen if isinstance(e, events.RunFinished)]
    assert finished and not finished[-1].stopped and finished[-1].step == 2, seen[-1]
    return Path(finished[-1].run_dir)


def test_a_finished_run_trains_more_steps_and_keeps_its_charts(qtbot, make_window, tiny_model_dir, monkeypatch):
    window = make_window(machine=GPU)
    run_dir = _train_to_the_end(qtbot, window, tiny_model_dir)
    runs, monitor = window.page("runs"), window.monitor
    runs.refresh()
    runs.select([next(i for i, s in enumerate(runs.summaries) if Path(s.run_dir) == run_dir)])
    assert runs.resume_button.text() == "Train more steps…" and runs.resume_button.isEnabled()
    assert "ended at its last step (2)" in runs.resume_button.toolTip()

    asked = []
    monkeypatch.setattr(runs, "ask_more_steps", lambda summary: asked.append(summary.step) or 3)
    runs.resume_button.click()
    assert asked == [2]
    assert window.current_page() == "monitor"
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=180_000)

    assert monitor.status == "finished", monitor.log.toPlainText()[-2000:]
    steps, _losses = monitor.loss_chart.points("raw")
    assert list(steps) == [1, 2, 3, 4, 5], "the two steps trained before stay on the chart, the three new follow"
    assert read_summary(run_dir).status == "finished" and read_summary(run_dir).step == 5
    assert RunConfig.load(run_dir / "config.toml").train.max_steps == 5, "the run's config says how long it is now"
    ends = [e for e in read_events(run_dir) if isinstance(e, (events.RunFinished, events.RunFailed))]
    assert isinstance(ends[-1], events.RunFinished) and ends[-1].step == 5

    runs.refresh()
    runs.select([next(i for i, s in enumerate(runs.summaries) if Path(s.run_dir) == run_dir)])
    assert "ended at its last step (5)" in runs.resume_button.toolTip()


def test_a_stopped_run_keeps_resume(make_window, tmp_path):
    from test_runs_page import _started, _step, _write

    window = make_window(machine=GPU)
    runs = window.page("runs")
    run_dir = Path(window.state.config.output.runs_dir) / "stopped-run"
    _write(
        run_dir,
        [
            _started(run_dir, 10, 1.0),
            _step(1, 10, 2.0, 2.0),
            events.RunFinished(step=1, run_dir=str(run_dir), adapter_dir="", final_loss=2.0, elapsed=1.0, stopped=True),
        ],
    )
    runs.refresh()
    runs.select([0])
    assert runs.resume_button.text() == "Resume" and "last checkpoint" in runs.resume_button.toolTip()


def test_the_monitor_offers_more_steps_for_the_run_it_shows_finished(qtbot, make_window, tiny_model_dir, monkeypatch):
    window = make_window(machine=GPU)
    run_dir = _train_to_the_end(qtbot, window, tiny_model_dir)
    monitor = window.monitor
    window.show_page("monitor")
    assert monitor.status == "finished" and monitor.more_button.isVisible()
    monkeypatch.setattr(monitor, "ask_more_steps", lambda name, step: 2 if (name, step) == (run_dir.name, 2) else 0)
    monitor.more_button.click()
    assert window.state.session.is_running and not monitor.more_button.isVisible()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=180_000)
    assert monitor.status == "finished" and monitor.ended.step == 4
    assert list(monitor.loss_chart.points("raw")[0]) == [1, 2, 3, 4]
    assert window.badge.title.text() == "Finished"

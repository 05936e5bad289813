"""The sidebar badge, the Monitor and the Runs page say one status for a run: paused, training elsewhere, finished,
stopped or interrupted. A run left training when its window closed is followed from a new window, and paused and
stopped from there (through its folder); the badge's text is shortened with "…", never cut mid-word."""

from __future__ import annotations

import time
from pathlib import Path

from shiboken6 import isValid
from test_run_checks import GPU
from test_train_gpus import ready_to_start

from hone.core import events
from hone.core.train.run_dir import read_events


def _pausing_trainer(config, control, resume=None):
    """A trainer that keeps to the RunControl as the core one does: steps until stopped, paused in between."""
    run_dir = "/nowhere/run"
    yield events.RunStarted(
        run_dir=run_dir,
        model="m",
        device="cpu",
        dtype="float32",
        params_total=1,
        params_trainable=1,
        total_steps=100,
        tokens_per_epoch=1,
    )
    step = 0
    while not control.stop_requested and step < 100:
        if control.paused:
            yield events.RunPaused(step=step)
            control.wait_while_paused()
            yield events.RunResumed(step=step)
            continue
        step += 1
        yield events.StepMetrics(
            step=step, total_steps=100, epoch=0.0, loss=1.0, lr=1e-4, grad_norm=1.0, tokens=1, trained_tokens=1,
            tokens_per_s=1.0, step_time=0.01, elapsed=0.01 * step,
        )  # fmt: skip
        time.sleep(0.02)
    yield events.RunFinished(step=step, run_dir=run_dir, adapter_dir="", final_loss=1.0, elapsed=1.0, stopped=True)


def test_the_badge_says_paused_while_the_run_is_paused(qtbot, make_window):
    window = make_window(machine=GPU, trainer=_pausing_trainer)
    monitor = window.monitor
    window.show_page("monitor")
    window.state.session.start(window.state.config)
    qtbot.waitUntil(monitor.pause_button.isEnabled, timeout=10_000)
    monitor.pause_button.click()
    qtbot.waitUntil(lambda: monitor.status == "paused", timeout=10_000)
    monitor.flush()
    assert window.badge.title.text() == "Paused" == monitor.status_pill.text()
    monitor.pause_button.click()
    qtbot.waitUntil(lambda: monitor.status == "running", timeout=10_000)
    assert window.badge.title.text() == "Training"


def test_the_badge_shortens_long_text_with_an_ellipsis(window):
    reason = "the training data /home/someone/datasets/a-very-long-folder-name/train-split.jsonl holds no usable rows"
    name = "20261205-110203-smollm2-135m-instruct-with-a-long-name"
    window.badge.show_past_run(name, events.RunFailed(reason=reason), None)
    detail = window.badge.detail
    shown = detail.text()
    assert shown.endswith("…") and shown != detail.full_text
    assert detail.fontMetrics().horizontalAdvance(shown) <= detail.contentsRect().width()
    assert detail.toolTip() == f"{name} · {reason}", "the whole text is a hover away"


def _row_status(window, run_dir: Path) -> str:
    runs = window.page("runs")
    runs.refresh()
    return runs.status_of(run_dir)


def test_a_run_left_training_is_paused_and_stopped_from_a_new_window(qtbot, make_window, tiny_model_dir, monkeypatch):
    first = make_window(machine=GPU)
    ready_to_start(first, tiny_model_dir)
    first.state.update("train.max_steps=5000", "output.checkpoint_every=0")
    first.page("train").background_box.setChecked(True)
    seen = []
    first.state.session.event.connect(seen.append)
    first.page("train").start()
    qtbot.waitUntil(lambda: any(isinstance(e, events.StepMetrics) for e in seen), timeout=120_000)
    run_dir = Path(next(e.run_dir for e in seen if isinstance(e, events.RunStarted)))
    monkeypatch.setattr(first, "ask_keep_on_close", lambda: "keep")
    first.close()
    qtbot.waitUntil(lambda: not isValid(first) or not first.isVisible(), timeout=5_000)

    window = make_window(machine=GPU)
    assert _row_status(window, run_dir) == "Training elsewhere"
    window.open_run(str(run_dir))
    monitor = window.monitor
    qtbot.waitUntil(lambda: monitor.following is not None, timeout=10_000)
    monitor.flush()
    assert monitor.status_pill.text() == "Training elsewhere" == window.badge.title.text()
    assert monitor.pause_button.isEnabled() and monitor.stop_button.isEnabled()

    monitor.pause_button.click()
    assert monitor.pause_button.text() == "Pausing…"
    qtbot.waitUntil(lambda: monitor.status == "paused", timeout=30_000)
    paused_at = monitor.last_step.step
    qtbot.wait(1500)
    assert monitor.last_step.step == paused_at, "no step runs while paused"
    monitor.flush()
    assert monitor.status_pill.text() == "Paused" == window.badge.title.text() == _row_status(window, run_dir)
    assert not window.page("runs").resume_button.isEnabled()

    monitor.stop_button.click()  # a paused run wakes up to stop, and saves first
    qtbot.waitUntil(lambda: monitor.following is None, timeout=60_000)
    assert monitor.status == "stopped"
    monitor.flush()
    said = (monitor.status_pill.text(), window.badge.title.text(), _row_status(window, run_dir))
    assert said == ("Stopped",) * 3, said
    ended = [e for e in read_events(run_dir) if isinstance(e, (events.RunFinished, events.RunFailed))]
    assert isinstance(ended[-1], events.RunFinished) and ended[-1].stopped and ended[-1].step < 5000
    assert not (run_dir / "pause.request").exists(), "the pause asked for ends with the run"


HOLDER = """
import signal, sys, time
# Ctrl-C stops it, as in a terminal, even when the tests were started in the background (which ignores SIGINT)
signal.signal(signal.SIGINT, signal.default_int_handler)
from hone.core.config import RunConfig
from hone.core.train.run_dir import RunWriter
from tests.app.test_monitor_states import _started, _step
writer = RunWriter(sys.argv[1], RunConfig())
t0 = time.time()
writer.write(_started(sys.argv[1], t0))
writer.write(_step(1, t0))
print("ready", flush=True)
try:
    time.sleep(120)
finally:
    writer.close()
"""


def test_a_run_from_a_terminal_can_be_stopped_from_the_monitor_not_paused(qtbot, make_window, tmp_path):
    import subprocess
    import sys

    run_dir = tmp_path / "runs" / "terminal"
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=root
    )  # holds the run as `hone train` in a terminal does: no pause file, Ctrl-C stops it
    try:
        assert holder.stdout.readline().strip() == "ready"
        window = make_window(machine=GPU)
        window.open_run(str(run_dir))
        monitor = window.monitor
        qtbot.waitUntil(lambda: monitor.following is not None, timeout=10_000)
        assert not monitor.pause_button.isEnabled() and "not started by Hone Studio" in monitor.pause_button.toolTip()
        assert monitor.stop_button.isEnabled()
        monitor.stop_button.click()
        assert monitor.stop_button.text() == "Stopping…" and not monitor.stop_button.isEnabled()
        holder.wait(timeout=30)
        qtbot.waitUntil(lambda: monitor.following is None, timeout=10_000)
        assert monitor.status == "interrupted"  # this stand-in ends on Ctrl-C without a RunFinished
    finally:
        holder.kill()
        holder.wait()

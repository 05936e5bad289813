"""The Studio end to end with the real core: choose a tiny model and the sample data, train, pause, resume, stop,
watch the charts, chat with the result, export it; a failing run shows its dialog; the GUI thread never stalls."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer

from hone.core.config import DEMO_TRAIN_DATA
from hone.core.events import (
    DatasetReport,
    Notice,
    RunFailed,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StepMetrics,
)

# How long the GUI thread may stall while a run trains: a fifth of a second is a visible hitch.
MAX_STALL_S = 0.2


class Heartbeat:
    """A 20 ms QTimer on the GUI thread; a gap between its ticks is a stall. Gaps are kept with the time they
    ended, so a test can tell loading stalls from training-loop stalls."""

    def __init__(self):
        self.last = time.monotonic()
        self.gaps: list[tuple[float, float]] = []  # (gap seconds, monotonic time it ended)
        self.timer = QTimer()
        self.timer.setInterval(20)
        self.timer.timeout.connect(self._tick)

    def _tick(self):
        now = time.monotonic()
        self.gaps.append((now - self.last, now))
        self.last = now

    def start(self):
        self.last = time.monotonic()
        self.timer.start()

    def stop(self):
        self.timer.stop()

    def longest(self, after: float = 0.0, before: float = float("inf")) -> float:
        """Longest stall that ended in (after, before]."""
        return max((gap for gap, end in self.gaps if after < end <= before), default=0.0)


def _set(form, key, value):
    editor = form.editors[key]
    if hasattr(editor, "setCurrentIndex"):
        editor.setCurrentIndex(editor.findData(value))
    elif hasattr(editor, "setChecked"):
        editor.setChecked(value)
    else:
        editor.setValue(value)


def test_train_pause_resume_stop_then_chat_and_export(qtbot, make_window, tiny_model_dir):
    from hone.core.models.shapes import build_model

    window = make_window(telemetry=True)
    model_dir = tiny_model_dir("tiny-dense")

    # Model page: choosing reads the config off the GUI thread
    window.page("model").choose(str(model_dir))
    qtbot.waitUntil(lambda: window.state.model_info is not None, timeout=120_000)
    reference = build_model("tiny-dense")
    info = window.state.model_info
    assert info["layers"] == reference.config.num_hidden_layers and info["hidden_size"] == 64
    assert info["params"] == sum(p.numel() for p in reference.parameters())
    assert window.page("model").params_tile.value() == f"{info['params'] / 1e6:.1f}M"

    # Data and Train pages
    window.page("data").set_files([DEMO_TRAIN_DATA])
    train = window.page("train")
    for key, value in [
        ("train.max_steps", 500),
        ("train.batch_tokens", 256),
        ("data.max_length", 256),
        ("speed.checkpoint", "off"),
        ("output.checkpoint_every", 0),
    ]:
        _set(train.form, key, value)
    assert train.problem_list() == [] and train.start_button.isEnabled()

    events, arrived = [], {}
    window.state.session.event.connect(events.append)
    window.state.session.event.connect(lambda e: arrived.setdefault(type(e).__name__, time.monotonic()))
    window.state.session.event.connect(
        lambda e: arrived.__setitem__("last step", time.monotonic()) if isinstance(e, StepMetrics) else None
    )
    steps = lambda: [e for e in events if isinstance(e, StepMetrics)]  # noqa: E731
    heartbeat = Heartbeat()
    # The objects earlier tests left behind go to the permanent generation: a full collection over them, triggered
    # by an allocation on the GUI thread, is a stall of the test session, not of the app (seen: 266 ms)
    gc.collect()
    gc.freeze()
    heartbeat.start()
    train.start_button.click()
    assert window.current_page() == "monitor"
    monitor = window.monitor
    qtbot.waitUntil(lambda: len(steps()) >= 2, timeout=120_000)
    # the data reports and the memory planner's notices come first (system memory on a CPU)
    assert isinstance(next(e for e in events if not isinstance(e, DatasetReport | Notice)), RunStarted)

    # pause: the trainer stops between steps, and no step arrives while paused
    qtbot.waitUntil(monitor.pause_button.isEnabled, timeout=10_000)
    monitor.pause_button.click()
    assert monitor.pause_button.text() == "Pausing…"
    qtbot.waitUntil(lambda: any(isinstance(e, RunPaused) for e in events), timeout=60_000)
    paused_at = len(steps())
    qtbot.wait(1500)
    assert len(steps()) == paused_at, "no step may run while paused"
    assert monitor.pause_button.text() == "Resume" and monitor.status_pill.text() == "Paused"

    # resume, then stop: the run saves and finishes as stopped
    monitor.pause_button.click()
    qtbot.waitUntil(lambda: any(isinstance(e, RunResumed) for e in events), timeout=30_000)
    qtbot.waitUntil(lambda: len(steps()) > paused_at, timeout=60_000)
    monitor.stop_button.click()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=120_000)
    heartbeat.stop()
    gc.unfreeze()
    finished = events[-1]
    assert isinstance(finished, RunFinished) and finished.stopped, events[-1]
    assert finished.step == len(steps()) < 500

    # charts received every step; the GUI thread never stalled
    monitor.flush()
    assert list(monitor.loss_chart.points("raw")[1]) == [e.loss for e in steps()]
    assert len(monitor.speed_chart.points("tps")[0]) == len(steps())
    assert monitor.status_pill.text() == "Stopped"
    assert monitor.memory_tile.value() != "—", "telemetry reports memory (system memory on this machine)"
    # The run trains in a process of its own: loading the model holds the GIL in single calls of 100 ms and more,
    # which froze the window by 250-630 ms while the run was a thread of the window's process
    assert window.state.session.in_child
    last_step = arrived["last step"]
    loading = heartbeat.longest(before=arrived["RunStarted"])
    training = heartbeat.longest(after=arrived["RunStarted"], before=last_step)
    saving = heartbeat.longest(after=last_step)
    print(
        f"GUI thread: longest stall {loading * 1000:.0f} ms while the model and data loaded, "
        f"{training * 1000:.0f} ms while training, {saving * 1000:.0f} ms while saving"
    )
    if window.state.session.in_child:
        assert loading < MAX_STALL_S, f"the GUI thread stalled {loading * 1000:.0f} ms while the run loaded"
    assert training < MAX_STALL_S, f"the GUI thread stalled {training * 1000:.0f} ms during training steps"
    assert saving < MAX_STALL_S, f"the GUI thread stalled {saving * 1000:.0f} ms while the run saved"

    # the run folder agrees with what the Monitor showed
    run_dir = Path(finished.run_dir)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in logged if r["event"] == "StepMetrics"] == [e.loss for e in steps()]
    runs = window.page("runs")
    runs.refresh()
    assert [Path(s.run_dir) for s in runs.summaries] == [run_dir]
    assert runs.table.item(0, 2).text() == "Stopped"

    # Chat: base and fine-tuned side by side, streamed off the GUI thread
    chat = window.page("chat")
    chat.refresh_runs()
    chat.select_run(str(run_dir))
    chat.load_selected()
    qtbot.waitUntil(lambda: chat.loaded, timeout=120_000)
    assert chat.has_adapter
    chat.max_tokens.setValue(6)
    chat.prompt.setPlainText("Extract: Ada, 36, Paris, engineer.")
    with qtbot.waitSignal(chat.reply_finished, timeout=120_000):
        chat.send()
    assert chat.replies["base"] and chat.replies["tuned"]
    assert chat.history["tuned"][-1] == {"role": "assistant", "content": chat.replies["tuned"]}

    # Export: the adapter folder, written by core and read back
    pytest.importorskip("hone.core.export", reason="the exporter has not landed in this checkout")
    export = window.page("export")
    export.refresh_runs()
    export.set_run(str(run_dir))
    export.select_format("adapter")
    with qtbot.waitSignal(export.exported, timeout=120_000) as blocker:
        export.export_button.click()
    result = blocker.args[0]
    assert getattr(result, "passed", False), getattr(result, "failures", result)
    out = Path(export.out_edit.text())
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert export.open_button.isEnabled()


def test_a_failing_run_shows_a_dialog_with_the_reason(qtbot, make_window, tmp_path):
    window = make_window()
    missing = tmp_path / "no-such-model"
    window.state.update(f'model.name_or_path="{missing.as_posix()}"', f'data.train=["{DEMO_TRAIN_DATA}"]')
    with qtbot.waitSignal(window.monitor.failure_shown, timeout=120_000) as blocker:
        window.page("train").start_button.click()
    event = blocker.args[0]
    assert isinstance(event, RunFailed) and str(missing.name) in event.reason
    dialog = window.monitor.failure_dialog
    assert dialog.isVisible() and dialog.text() == event.reason
    assert dialog.informativeText(), "the dialog gives advice"
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=30_000)
    assert window.badge.title.text() == "Failed"
    dialog.close()


TORCH_PROBE = r"""
import sys, time
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
app = QApplication([])
from hone.app.settings import Settings
from hone.app.window import MainWindow
window = MainWindow(Settings(QSettings(sys.argv[2], QSettings.IniFormat)), telemetry=True)
window.show()
for name in ("model", "data", "train", "monitor", "chat", "export", "runs"):
    window.show_page(name)
    app.processEvents()
print("before", "torch" in sys.modules, flush=True)
window.page("model").choose(sys.argv[1])
deadline = time.monotonic() + 240
while window.state.model_info is None and time.monotonic() < deadline:
    app.processEvents()
    time.sleep(0.02)
print("after", "torch" in sys.modules, window.state.model_info is not None, flush=True)
window.close()
"""


def test_torch_never_loads_in_the_window_s_process(tiny_model_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, str(tiny_model_dir("tiny-dense")), str(tmp_path / "settings.ini")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1", "PATH": "", "HOME": str(tmp_path)},
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith(("before", "after"))]
    # the model is read in the helper process (hone.app.helper_process): the window's own process never imports torch
    assert lines == ["before False", "after False True"], out.stdout + out.stderr

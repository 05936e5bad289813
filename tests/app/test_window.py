"""Window-level behaviour: settings persist, Runs overlays two runs' losses, closing during a run stops and saves
it first, and a worker's exception becomes a RunFailed event instead of a crash."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox
from shiboken6 import isValid

from hone.core.config import RunConfig
from hone.core.events import RunFailed, RunFinished, RunStarted, StepMetrics
from tests.app.conftest import settle_tasks


def _write_run(folder, losses, stopped=False):
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(folder, RunConfig())
    t0 = time.time()
    writer.write(
        RunStarted(
            run_dir=str(folder),
            model="m",
            device="cpu",
            dtype="float32",
            params_total=1,
            params_trainable=1,
            total_steps=len(losses),
            tokens_per_epoch=1,
            time=t0,
        )
    )
    for step, loss in enumerate(losses, start=1):
        writer.write(
            StepMetrics(
                step=step,
                total_steps=len(losses),
                epoch=0.0,
                loss=loss,
                lr=1e-4,
                grad_norm=1.0,
                tokens=1,
                trained_tokens=1,
                tokens_per_s=1.0,
                step_time=0.1,
                elapsed=0.1 * step,
            )
        )
    writer.write(
        RunFinished(
            step=len(losses), run_dir=str(folder), adapter_dir="", final_loss=losses[-1], elapsed=1.0, stopped=stopped
        )
    )
    writer.close()


def test_runs_page_lists_runs_and_overlays_two_loss_curves(qtbot, window, tmp_path):
    runs_dir = tmp_path / "runs"
    _write_run(runs_dir / "first", [3.0, 2.5, 2.0])
    time.sleep(0.01)
    _write_run(runs_dir / "second", [3.1, 2.2, 1.4, 1.1])
    page = window.page("runs")
    page.refresh()
    names = [page.table.item(row, 0).text() for row in range(page.table.rowCount())]
    assert names == ["second", "first"], "newest first"
    page.select([0, 1])
    assert page.compare_button.isEnabled() and not page.open_button.isEnabled()
    page.compare_selected()  # read off the GUI thread
    qtbot.waitUntil(lambda: page.comparison.comparison is not None and not page.comparison.reading, timeout=10_000)
    for key, name in (("run0", "second"), ("run1", "first")):  # rows in table order
        logged = [json.loads(line) for line in (runs_dir / name / "metrics.jsonl").read_text().splitlines()]
        expected = [r["loss"] for r in logged if r["event"] == "StepMetrics"]
        assert list(page.comparison.charts["loss"].points(key)[1]) == expected
    page.select([1])
    page.open_selected()
    assert window.current_page() == "monitor"
    assert list(window.monitor.loss_chart.points("raw")[1]) == [3.0, 2.5, 2.0]


def test_settings_persist_page_geometry_recents_and_theme(qtbot, make_window, settings):
    window = make_window()
    window.show_page("train")
    window.state.set_model("Qwen/Qwen3-0.6B", None)
    window.resize(1111, 777)
    window._cycle_theme()
    mode = window.theme.mode
    settle_tasks(qtbot)  # the machine detection the window started has ended (conftest.settle_tasks says why)
    window.close()
    assert settings.page() == "train"
    assert settings.recent_models()[0] == "Qwen/Qwen3-0.6B"
    assert settings.config().model.name_or_path == "Qwen/Qwen3-0.6B"
    assert settings.theme() == mode
    again = make_window()
    assert again.current_page() == "train"
    assert again.page("model").name_box.currentText() == "Qwen/Qwen3-0.6B"
    again.theme.set_mode("system")


def _slow_trainer(config, control, resume=None):
    """Real event objects at a steady pace, obeying the control object like the core trainer does."""
    yield RunStarted(
        run_dir="/tmp/x",
        model="m",
        device="cpu",
        dtype="float32",
        params_total=1,
        params_trainable=1,
        total_steps=1000,
        tokens_per_epoch=1,
    )
    for step in range(1, 1001):
        control.wait_while_paused()
        if control.stop_requested:
            yield RunFinished(
                step=step - 1, run_dir="/tmp/x", adapter_dir="/tmp/x/adapter", final_loss=1.0, elapsed=0.1, stopped=True
            )
            return
        time.sleep(0.02)
        yield StepMetrics(
            step=step,
            total_steps=1000,
            epoch=0.0,
            loss=1.0,
            lr=1e-4,
            grad_norm=1.0,
            tokens=1,
            trained_tokens=1,
            tokens_per_s=1.0,
            step_time=0.02,
            elapsed=0.02 * step,
        )


def test_closing_during_a_run_asks_then_stops_saves_and_closes(qtbot, make_window, monkeypatch):
    window = make_window(trainer=_slow_trainer)
    events = []
    window.state.session.event.connect(events.append)
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: any(isinstance(e, StepMetrics) for e in events), timeout=10_000)
    asked = []
    monkeypatch.setattr(window, "ask_stop_on_close", lambda: asked.append(1) or QMessageBox.Cancel)
    window.close()
    assert asked and window.isVisible() and window.state.session.is_running, "Cancel keeps training"
    monkeypatch.setattr(window, "ask_stop_on_close", lambda: asked.append(1) or QMessageBox.Yes)
    window.close()
    # the window deletes itself once closed, so "closed" is "deleted, or at least hidden"
    qtbot.waitUntil(lambda: not isValid(window) or not window.isVisible(), timeout=10_000)
    assert isinstance(events[-1], RunFinished) and events[-1].stopped, "the run saved and stopped before closing"


def test_an_exception_in_the_trainer_becomes_a_failed_event(qtbot, make_window):
    def broken(config, control, resume=None):
        yield RunStarted(
            run_dir="/tmp/x",
            model="m",
            device="cpu",
            dtype="float32",
            params_total=1,
            params_trainable=1,
            total_steps=10,
            tokens_per_epoch=1,
        )
        raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")

    window = make_window(trainer=broken)
    with qtbot.waitSignal(window.monitor.failure_shown, timeout=10_000) as blocker:
        window.state.session.start(window.state.config)
    event = blocker.args[0]
    assert isinstance(event, RunFailed) and "RuntimeError: CUDA out of memory" in event.reason
    assert "tokens per batch" in event.advice and "Traceback" in event.details
    window.monitor.failure_dialog.close()


def test_settings_file_is_the_one_given(settings, tmp_path):
    assert QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat).value("config/toml")


def test_resume_continues_a_run_with_its_own_config(qtbot, make_window, tmp_path):
    seen = []

    def recording(config, control, resume=None):
        seen.append((config, resume))
        yield RunFinished(step=3, run_dir=str(resume), adapter_dir="", final_loss=1.0, elapsed=0.1)

    window = make_window(trainer=recording)
    run_dir = tmp_path / "runs" / "old"
    _write_run(run_dir, [2.0, 1.5, 1.0], stopped=True)  # stopped early: Resume goes on (a finished run trains more)
    stored = RunConfig().with_overrides(["lora.r=7", "train.max_steps=10"])
    stored.save(run_dir / "config.toml")
    page = window.page("runs")
    page.refresh()
    page.select([0])
    page.resume_button.click()
    qtbot.waitUntil(lambda: not window.state.session.is_running and bool(seen), timeout=10_000)
    config, resume = seen[0]
    assert resume == run_dir and config == RunConfig.load(run_dir / "config.toml")
    assert config.lora.r == 7, "the run's own settings, not the form's"
    assert window.current_page() == "monitor"

"""The Monitor after a resume, for a past run, without a GPU, after a failure; the sidebar badge of a shown run."""

from __future__ import annotations

import dataclasses
import time

import pytest

from hone.core.api import MachineFacts
from hone.core.config import RunConfig
from hone.core.events import RunFailed, RunFinished, RunStarted, StepMetrics
from hone.core.machine.telemetry import TelemetrySample

GIB = 2**30
TOTAL = 12


def _started(run_dir, t, resumed: int = 0) -> RunStarted:
    return RunStarted(
        run_dir=str(run_dir),
        model="tiny",
        device="cpu",
        dtype="float32",
        params_total=1000,
        params_trainable=10,
        total_steps=TOTAL,
        tokens_per_epoch=5000,
        resumed_from_step=resumed,
        time=t,
    )


def _step(s: int, t: float, loss: float | None = None) -> StepMetrics:
    return StepMetrics(
        step=s,
        total_steps=TOTAL,
        epoch=s / TOTAL,
        loss=loss if loss is not None else 2.0 / s,
        lr=1e-4,
        grad_norm=1.0,
        tokens=1000,
        trained_tokens=400,
        tokens_per_s=100.0 * s,
        step_time=0.5,
        elapsed=0.5 * s,
        time=t + 0.5 * s,
    )


def _resumed_run(run_dir, stop_at=7, checkpoint=5):
    """A run stopped after step `stop_at` (checkpoint at `checkpoint`), then resumed to the end: the events in the
    order its metrics.jsonl holds them. The steps after the checkpoint are trained twice, with other losses."""
    t0 = time.time() - 100
    first = [
        _started(run_dir, t0),
        *[_step(s, t0) for s in range(1, stop_at + 1)],
        RunFinished(
            step=stop_at, run_dir=str(run_dir), adapter_dir="", final_loss=2.0 / stop_at, elapsed=3.0, stopped=True
        ),
    ]
    t1 = t0 + 50
    second = [
        _started(run_dir, t1, resumed=checkpoint),
        *[_step(s, t1, loss=1.0 / s) for s in range(checkpoint + 1, TOTAL + 1)],
        RunFinished(step=TOTAL, run_dir=str(run_dir), adapter_dir="", final_loss=1.0 / TOTAL, elapsed=9.0),
    ]
    return first, second


def _expected_losses(checkpoint=5):
    return [2.0 / s for s in range(1, checkpoint + 1)] + [1.0 / s for s in range(checkpoint + 1, TOTAL + 1)]


def _write(run_dir, events):
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(run_dir, RunConfig())
    for event in events:
        writer.write(event)
    writer.close()


@pytest.fixture
def window(make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    window.show_page("monitor")
    return window


def test_a_resumed_run_replayed_from_runs_keeps_every_step(window, tmp_path):
    run_dir = tmp_path / "runs" / "resumed"
    first, second = _resumed_run(run_dir)
    _write(run_dir, first + second)
    window.monitor.show_run(run_dir)
    x, y = window.monitor.loss_chart.points("raw")
    assert list(x) == list(range(1, TOTAL + 1))
    assert list(y) == pytest.approx(_expected_losses())
    assert list(window.monitor.lr_chart.points("lr")[0]) == list(range(1, TOTAL + 1))


def test_a_resumed_run_followed_live_keeps_the_steps_from_before_the_resume(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "runs" / "resumed"
    first, second = _resumed_run(run_dir)
    _write(run_dir, first)
    RunConfig().save(run_dir / "config.toml")

    def resume(config, control, resume=None):
        from hone.core.train.run_dir import RunWriter

        writer = RunWriter(run_dir, config)  # the trainer appends to the same metrics.jsonl as it goes
        for event in second:
            writer.write(event)
            yield event
        writer.close()

    window = make_window(trainer=resume, machine=MachineFacts(gpu=""))
    window.show_page("monitor")
    window.state.session.resume_run(run_dir)
    qtbot.waitUntil(lambda: window.monitor.status == "finished", timeout=10_000)
    x, y = window.monitor.loss_chart.points("raw")
    assert list(x) == list(range(1, TOTAL + 1))
    assert list(y) == pytest.approx(_expected_losses())


def test_a_past_run_shows_its_own_memory_not_this_machines(window, tmp_path):
    run_dir = tmp_path / "runs" / "past"
    t0 = time.time()
    steps = [dataclasses.replace(_step(s, t0), mem_allocated=3 * GIB, mem_reserved=4 * GIB) for s in (1, 2)]
    _write(
        run_dir,
        [
            _started(run_dir, t0),
            *steps,
            RunFinished(step=2, run_dir=str(run_dir), adapter_dir="", final_loss=0.25, elapsed=1.0),
        ],
    )
    window.monitor.telemetry(TelemetrySample("NVIDIA H200", "gpu", 100 * GIB, 141 * GIB, 50.0, 40.0, 200.0))
    window.monitor.show_run(run_dir)
    tile = window.monitor.memory_tile
    assert tile.value() == "3.0 GiB" and "141" not in tile.detail() and "100" not in tile.value()


def test_without_a_gpu_the_tiles_say_system_memory(window):
    window.monitor.telemetry(TelemetrySample("System memory", "system", 6 * GIB, 16 * GIB, note="no NVIDIA GPU found"))
    window.monitor.flush()
    assert window.monitor.memory_tile.title() == "SYSTEM MEMORY"
    assert "GPU" not in window.monitor.gpu_tile.title()
    assert window.monitor.util_chart.headline.text() == "no NVIDIA GPU"


def test_the_big_loss_number_of_a_finished_run_is_its_final_loss(window, tmp_path):
    run_dir = tmp_path / "runs" / "done"
    t0 = time.time()
    losses = [3.0, 2.0, 1.0, 0.0295]
    _write(
        run_dir,
        [
            _started(run_dir, t0),
            *[_step(s, t0, loss) for s, loss in enumerate(losses, 1)],
            RunFinished(step=4, run_dir=str(run_dir), adapter_dir="", final_loss=0.0295, elapsed=2.0),
        ],
    )
    window.monitor.show_run(run_dir)
    assert window.monitor.loss_tile.value() == "0.0295"


def test_step_charts_are_labelled_step_with_whole_step_ticks(window):
    monitor = window.monitor
    for chart in (monitor.loss_chart, monitor.speed_chart, monitor.lr_chart):
        axis = chart.plot.getPlotItem().getAxis("bottom")
        assert axis.labelText == "step"
        for _spacing, values in axis.tickValues(1.0, 3.0, 400):
            assert all(float(v).is_integer() for v in values), values


def test_a_failure_reads_as_one(window, tmp_path):
    monitor = window.monitor
    monitor.show_dialogs = False
    monitor.live = True
    monitor._running_changed(True)
    monitor.handle(_started(tmp_path, time.time()))
    monitor.handle(RunFailed(reason="the data file is empty", advice="choose another file"))
    monitor.flush()
    assert monitor.header.subtitle.text() == "Failed: the data file is empty"
    assert monitor.status_pill.text() == "Failed"
    assert window.theme.palette.danger in monitor.status_pill.styleSheet()
    assert "Waiting for the first step" not in monitor.loss_chart._empty.text()


def test_the_sidebar_badge_describes_the_run_being_shown(window, tmp_path):
    run_dir = tmp_path / "runs" / "done"
    t0 = time.time()
    _write(
        run_dir,
        [
            _started(run_dir, t0),
            _step(1, t0, 0.5),
            RunFinished(step=1, run_dir=str(run_dir), adapter_dir="", final_loss=0.5, elapsed=1.0),
        ],
    )
    window.open_run(str(run_dir))
    assert window.badge.title.text() == "Finished"
    assert "done" in window.badge.detail.text() and "0.500" in window.badge.detail.text()

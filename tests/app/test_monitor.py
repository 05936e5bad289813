"""The Monitor turns core events into chart points, numbers and a log, redraws at ~10 Hz, and shows failures."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hone.app.pages.monitor import SMOOTHING
from hone.core.config import RunConfig
from hone.core.events import EvalMetrics, Notice, RunFailed, RunFinished, RunStarted, StepMetrics

TOTAL = 40
GIB = 2**30


def _started(t0: float, is_moe: bool = False) -> RunStarted:
    return RunStarted(
        run_dir="/runs/r1",
        model="tiny",
        device="cpu",
        dtype="float32",
        params_total=1000,
        params_trainable=10,
        total_steps=TOTAL,
        tokens_per_epoch=5000,
        is_moe=is_moe,
        speed_paths={"attention": "sdpa (CPU)"},
        time=t0,
    )


def _steps(t0: float, experts: int = 0) -> list[StepMetrics]:
    rng = np.random.default_rng(0)
    return [
        StepMetrics(
            step=s,
            total_steps=TOTAL,
            epoch=s / TOTAL,
            loss=float(3.0 / s + rng.uniform(0, 0.3)),
            lr=2e-4 * (1 - s / TOTAL),
            grad_norm=1.0,
            tokens=1000,
            trained_tokens=400,
            tokens_per_s=1000.0 + s,
            step_time=0.5,
            elapsed=0.5 * s,
            mem_allocated=s * GIB // 8,
            mem_reserved=2 * GIB,
            expert_load=[s % 3, 1, 2, 3][:experts] if experts else [],
            time=t0 + 0.5 * s,
        )
        for s in range(1, TOTAL + 1)
    ]


def _reference_smoothing(values, beta=SMOOTHING):
    """TensorBoard-style debiased EMA, written out independently of the app's implementation."""
    out, ema = [], 0.0
    for n, v in enumerate(values, start=1):
        ema = beta * ema + (1 - beta) * v
        out.append(ema / (1 - beta**n))
    return out


@pytest.fixture
def window(make_window):
    window = make_window()
    window.show_page("monitor")
    return window


def test_events_become_chart_points_and_numbers(window):
    monitor = window.monitor
    t0 = time.time()
    steps = _steps(t0, experts=4)
    monitor.handle(_started(t0, is_moe=True))
    for event in steps:
        monitor.handle(event)
    monitor.handle(EvalMetrics(step=20, loss=1.5, tokens=300, time=t0 + 10))
    monitor.handle(EvalMetrics(step=40, loss=1.2, tokens=300, time=t0 + 20))
    monitor.flush()

    x, y = monitor.loss_chart.points("raw")
    assert list(x) == list(range(1, TOTAL + 1))
    assert list(y) == [s.loss for s in steps]
    _, smooth = monitor.loss_chart.points("smooth")
    assert np.allclose(smooth, _reference_smoothing([s.loss for s in steps]), rtol=1e-12)
    assert list(zip(*monitor.loss_chart.points("eval"))) == [(20.0, 1.5), (40.0, 1.2)]
    assert list(monitor.lr_chart.points("lr")[1]) == [s.lr for s in steps]
    assert list(monitor.speed_chart.points("tps")[1]) == [s.tokens_per_s for s in steps]
    mem_x, mem_y = monitor.memory_chart.points("allocated")
    assert np.allclose(mem_x, [0.5 * s for s in range(1, TOTAL + 1)])  # seconds since RunStarted
    assert np.allclose(mem_y, [s / 8 for s in range(1, TOTAL + 1)], atol=1e-9)
    expected_load = np.sum([s.expert_load for s in steps], axis=0)
    assert list(monitor.expert_chart.values) == list(expected_load)
    assert not monitor.expert_chart.isHidden()
    assert monitor.progress.value() == 1000
    assert monitor.loss_tile.value() == f"{steps[-1].loss:.4f}", "the big number is the step's loss"
    assert f"smoothed {smooth[-1]:.4f}" in monitor.loss_tile.detail()
    assert monitor.speed_tile.value() == f"{steps[-1].tokens_per_s:,.0f}"
    log = monitor.log.toPlainText()
    assert "attention: sdpa (CPU)" in log and "Eval at step 20: loss 1.5000" in log


def test_eta_comes_from_recent_step_times(window):
    monitor = window.monitor
    t0 = time.time()
    monitor.handle(_started(t0))
    for event in _steps(t0)[:10]:
        monitor.handle(event)
    monitor.flush()
    # 30 steps left at 0.5 s each
    assert monitor.eta_text.text() == "ETA 15s"
    assert monitor.expert_chart.isHidden(), "dense runs have no expert chart"


def test_speed_tile_says_when_steps_wait_for_data(window):
    """A step that spent a noticeable share of its time waiting for its batches (image decoding falling behind) says
    so under the tokens/s; one that did not, or the first step (always collated in place), does not."""
    from dataclasses import replace

    monitor = window.monitor
    t0 = time.time()
    monitor.handle(_started(t0))
    steps = _steps(t0)
    monitor.handle(replace(steps[0], data_wait_s=0.4))  # step 1 collates its own batches: nothing to flag
    monitor.flush()
    assert "waiting" not in monitor.speed_tile.detail()
    monitor.handle(replace(steps[1], data_wait_s=0.2))  # 0.2 of a 0.5 s step
    monitor.flush()
    assert "waiting for data 40% of the step" in monitor.speed_tile.detail()
    monitor.handle(replace(steps[2], data_wait_s=0.001))
    monitor.flush()
    assert "waiting" not in monitor.speed_tile.detail()


def test_charts_redraw_at_most_ten_times_a_second(qtbot, window):
    monitor = window.monitor
    monitor.handle(_started(time.time()))
    qtbot.wait(200)  # the page's first layout and paint
    calls = []
    curve = monitor.loss_chart.series["raw"].curve
    original = curve.setData
    curve.setData = lambda *a, **k: (calls.append(time.monotonic()), original(*a, **k))
    burst = 300
    start = time.monotonic()
    for step in range(1, burst + 1):  # a burst of steps, with the event loop running in between
        monitor.handle(
            StepMetrics(
                step=step,
                total_steps=10**6,
                epoch=0.0,
                loss=1.0,
                lr=1e-4,
                grad_norm=1.0,
                tokens=1,
                trained_tokens=1,
                tokens_per_s=1.0,
                step_time=0.001,
                elapsed=0.0,
            )
        )
        if step % 3 == 0:
            qtbot.wait(1)
    qtbot.wait(150)
    elapsed = time.monotonic() - start
    assert 1 <= len(calls) <= elapsed / 0.1 + 2, f"{len(calls)} redraws in {elapsed:.2f} s (expected ~10 Hz)"
    assert len(calls) < burst / 10, f"{len(calls)} redraws for {burst} steps: the chart is not throttled"
    assert len(monitor.loss_chart.points("raw")[0]) == burst, "every step is kept even though few are drawn"


def test_hidden_charts_accumulate_without_drawing(qtbot, window):
    monitor = window.monitor
    monitor.handle(_started(time.time()))
    window.show_page("model")
    calls = []
    curve = monitor.loss_chart.series["raw"].curve
    original = curve.setData
    curve.setData = lambda *a, **k: (calls.append(1), original(*a, **k))
    for event in _steps(time.time())[:5]:
        monitor.handle(event)
    qtbot.wait(300)
    assert calls == [], "a hidden Monitor draws nothing"
    window.show_page("monitor")
    assert len(calls) == 1 and len(curve.getData()[0]) == 5, "showing it draws every point at once"


@pytest.mark.parametrize(
    "advice, expected",
    [
        ("lower train.batch_tokens, set speed.checkpoint = offload", "Lower train.batch_tokens"),
        ("", "fewer tokens per batch"),  # core gave no advice: the app's own for out-of-memory
    ],
)
def test_a_failed_run_opens_a_dialog_with_reason_and_advice(qtbot, window, advice, expected):
    monitor = window.monitor
    monitor.handle(_started(time.time()))
    monitor.handle(
        RunFailed(
            reason="CUDA out of memory. Tried to allocate 2.00 GiB",
            advice=advice,
            step=3,
            details="Traceback (most recent call last): ...",
        )
    )
    dialog = monitor.failure_dialog
    assert dialog is not None and dialog.isVisible()
    assert "out of memory" in dialog.text()
    assert expected in dialog.informativeText()
    assert dialog.detailedText().startswith("Traceback")
    assert monitor.status_pill.text() == "Failed" or monitor.status == "failed"
    dialog.close()


def test_a_past_run_replays_from_its_folder(window, tmp_path):
    from hone.core.train.run_dir import RunWriter

    run_dir = tmp_path / "runs" / "past"
    writer = RunWriter(run_dir, RunConfig())
    t0 = time.time()
    steps = _steps(t0)
    for event in [
        _started(t0),
        Notice(topic="attention", message="fell back to sdpa"),
        *steps,
        RunFinished(
            step=TOTAL,
            run_dir=str(run_dir),
            adapter_dir=str(run_dir / "adapter"),
            final_loss=steps[-1].loss,
            elapsed=20.0,
        ),
    ]:
        writer.write(event)
    writer.close()
    window.monitor.show_run(run_dir)
    assert list(window.monitor.loss_chart.points("raw")[1]) == [s.loss for s in steps]
    assert window.monitor.status == "finished"
    assert "fell back to sdpa" in window.monitor.log.toPlainText()
    assert not window.monitor.pause_button.isEnabled() and not window.monitor.stop_button.isEnabled()


@pytest.mark.parametrize(
    ("source", "label"),
    [("gpu", "of 8.0 GiB"), ("system", "of 8.0 GiB (system)"), ("unified", "of 8.0 GiB (unified memory)")],
)
def test_memory_tile_names_where_memory_comes_from(window, source, label):
    from hone.core.machine.telemetry import TelemetrySample

    window.monitor.telemetry(TelemetrySample("NVIDIA GB10", source, 2 << 30, 8 << 30, 12.0, 50.0, 30.0))
    window.monitor.flush()
    assert window.monitor.memory_tile.detail() == label

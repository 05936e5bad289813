"""Memory re-plans (Notice(topic="memory", step=N)) are marked on the Monitor's memory chart with a vertical line,
live and when a past run is replayed from its folder.

The memory chart's x axis is seconds since the run started (device memory is sampled in time, not per step), so
the mark for "from step N on" stands where step N began: when step N-1's StepMetrics came, or at 0 for step 0/1.
"""

from __future__ import annotations

import time

import pyqtgraph as pg
import pytest

from hone.core.config import RunConfig
from hone.core.events import Notice, RunFinished, RunStarted, StepMetrics

GIB = 2**30
TOTAL = 6
STEP_S = 0.5  # seconds per step in the events below
OOM = "out of GPU memory at step 3: running each micro-batch as 2 smaller ones"
FIT = (
    "a step needs ≈ 9.3 GiB; 7.6 GiB free on NVIDIA GeForce RTX 4060: it does not fit as set, so the run uses "
    "activation offload (≈ 6.1 GiB; train.fit_memory = false keeps the settings as they are)"
)


def _started(run_dir, t0: float) -> RunStarted:
    return RunStarted(
        run_dir=str(run_dir),
        model="tiny",
        device="cuda",
        dtype="bfloat16",
        params_total=10,
        params_trainable=1,
        total_steps=TOTAL,
        tokens_per_epoch=100,
        time=t0,
    )


def _step(s: int, t0: float) -> StepMetrics:
    return StepMetrics(
        step=s,
        total_steps=TOTAL,
        epoch=s / TOTAL,
        loss=1.0 / s,
        lr=1e-4,
        grad_norm=1.0,
        tokens=10,
        trained_tokens=5,
        tokens_per_s=100.0,
        step_time=STEP_S,
        elapsed=STEP_S * s,
        mem_allocated=(4 if s < 3 else 2) * GIB,
        mem_reserved=5 * GIB,
        time=t0 + STEP_S * s,
    )


def _events(run_dir, t0: float, early: list[Notice] = ()) -> list:
    """A run whose step 3 ran out of memory and went on with split micro-batches, with notices that mark nothing."""
    return [
        *early,
        _started(run_dir, t0),
        _step(1, t0),
        _step(2, t0),
        Notice(topic="memory", message=OOM, level="warning", step=3, time=t0 + 2.6 * STEP_S),
        *[_step(s, t0) for s in range(3, TOTAL + 1)],
        Notice(topic="memory", message="peak 3.9 GiB of 7.6 GiB", time=t0 + 4 * STEP_S),  # step None
        Notice(topic="attention", message="fell back to sdpa from step 5", step=5, time=t0 + 4 * STEP_S),
        RunFinished(
            step=TOTAL,
            run_dir=str(run_dir),
            adapter_dir="",
            final_loss=1.0 / TOTAL,
            elapsed=TOTAL * STEP_S,
            time=t0 + (TOTAL + 1) * STEP_S,
        ),
    ]


def _lines(chart) -> list[pg.InfiniteLine]:
    return [item for item in chart.plot.getPlotItem().items if isinstance(item, pg.InfiniteLine)]


@pytest.fixture
def window(make_window):
    window = make_window()
    window.show_page("monitor")
    return window


def test_a_live_replan_is_marked_once_where_its_step_began(qtbot, make_window, tmp_path):
    run_dir, t0 = tmp_path / "runs" / "live", time.time()

    def trainer(config, control, resume=None):
        yield from _events(run_dir, t0)

    window = make_window(trainer=trainer)
    window.show_page("monitor")
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: window.monitor.status == "finished", timeout=10_000)
    chart = window.monitor.memory_chart
    chart.flush()
    assert [mark.value() for mark in chart.marks] == [2 * STEP_S], "step 3 began when step 2 ended, 1.0 s in"
    mark = chart.marks[0]
    assert mark.label.toPlainText() == "out of GPU memory at\nstep 3", "the first clause, in two short lines"
    assert mark.toolTip() == f"Step 3: {OOM}"
    for _ in range(3):  # redraws draw the mark that exists, they never add one
        window.monitor.flush()
        qtbot.wait(60)
    assert _lines(chart) == [mark]
    for other in (window.monitor.loss_chart, window.monitor.speed_chart, window.monitor.lr_chart):
        assert other.marks == [] and _lines(other) == []


def test_a_replayed_run_shows_its_marks_and_the_next_run_clears_them(window, tmp_path):
    from hone.core.train.run_dir import RunWriter

    t0 = time.time() - 60
    marked, plain = tmp_path / "runs" / "marked", tmp_path / "runs" / "plain"
    writer = RunWriter(marked, RunConfig())
    for event in _events(marked, t0):
        writer.write(event)
    writer.close()
    writer = RunWriter(plain, RunConfig())
    for event in [_started(plain, t0), _step(1, t0), _step(2, t0)]:
        writer.write(event)
    writer.close()

    window.monitor.show_run(marked)
    chart = window.monitor.memory_chart
    assert [mark.value() for mark in chart.marks] == [2 * STEP_S]
    assert _lines(chart) == chart.marks
    window.monitor.show_run(marked)  # opened again: still one
    assert [mark.value() for mark in chart.marks] == [2 * STEP_S] and len(_lines(chart)) == 1
    window.monitor.show_run(plain)
    assert chart.marks == [] and _lines(chart) == []


def test_a_replan_before_the_first_step_is_marked_at_the_start(window, tmp_path):
    """The memory planner fits the run before the model loads: its notice (step 0) comes before RunStarted."""
    t0 = time.time()
    fit = Notice(topic="memory", message=FIT, level="warning", step=0, time=t0 - 5)
    for event in _events(tmp_path, t0, early=[fit]):
        window.monitor.handle(event)
    window.monitor.flush()
    chart = window.monitor.memory_chart
    assert [mark.value() for mark in chart.marks] == [0.0, 2 * STEP_S]
    assert chart.marks[0].label.toPlainText() == "a step needs ≈ 9.3 GiB"
    assert chart.marks[0].toolTip() == f"Before the first step: {FIT}"


def test_notices_without_a_step_or_about_other_things_mark_nothing(window, tmp_path):
    t0 = time.time()
    for event in [
        _started(tmp_path, t0),
        _step(1, t0),
        Notice(topic="memory", message="peak 3.9 GiB of 7.6 GiB", time=t0 + 1),
        Notice(topic="attention", message="fell back to sdpa", level="warning", step=2, time=t0 + 1),
        _step(2, t0),
    ]:
        window.monitor.handle(event)
    window.monitor.flush()
    assert window.monitor.memory_chart.marks == [] and _lines(window.monitor.memory_chart) == []

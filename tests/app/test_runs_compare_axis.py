"""The Runs page comparison's x axis says what it counts ("step" or "tokens seen") and ticks only at whole numbers,
even for runs of two steps, where pyqtgraph alone would put ticks at 1.2, 1.4 … 1.8."""

from __future__ import annotations

import time

import pytest

from hone.app.pages.runs_compare import STEPS, TOKENS, RunComparisonView
from hone.core.config import RunConfig
from hone.core.events import RunFinished, RunStarted, StepMetrics


def _write_run(run_dir, losses: list[float], tokens: int) -> None:
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(run_dir, RunConfig())
    writer.write(
        RunStarted(
            run_dir=str(run_dir),
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=len(losses),
            tokens_per_epoch=tokens * len(losses),
            time=time.time(),
        )
    )
    for step, loss in enumerate(losses, 1):
        writer.write(
            StepMetrics(
                step=step,
                total_steps=len(losses),
                epoch=0.0,
                loss=loss,
                lr=1e-4,
                grad_norm=1.0,
                tokens=tokens,
                trained_tokens=tokens,
                tokens_per_s=100.0,
                step_time=0.1,
                elapsed=0.1 * step,
            )
        )
    writer.write(RunFinished(step=len(losses), run_dir=str(run_dir), adapter_dir="", final_loss=losses[-1], elapsed=1))
    writer.close()


@pytest.mark.parametrize("x, label", [(STEPS, "step"), (TOKENS, "tokens seen")])
def test_the_x_axis_is_labelled_and_ticks_at_whole_numbers(qtbot, tmp_path, x, label):
    _write_run(tmp_path / "a", [2.0, 1.5], tokens=3)
    _write_run(tmp_path / "b", [2.2, 1.2], tokens=3)
    view = RunComparisonView()
    qtbot.addWidget(view)
    view.resize(1000, 900)
    view.show()
    view.compare([tmp_path / "a", tmp_path / "b"])
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=10_000)
    view.set_x(x)
    last = 2 if x == STEPS else 6  # steps 1-2, or 3 and 6 tokens seen
    chart = view.charts["loss"]
    box = chart.plot.getPlotItem().getViewBox()
    qtbot.waitUntil(lambda: box.viewRange()[0][0] <= last / 2 and box.viewRange()[0][1] >= last, timeout=5_000)
    axis = chart.plot.getPlotItem().getAxis("bottom")
    assert axis.labelText == label
    low, high = box.viewRange()[0]
    assert high - low < 8, "a narrow range, where fractional ticks would come"
    values = [v for _spacing, level in axis.tickValues(low, high, axis.width()) for v in level]
    assert values, "the axis has ticks"
    assert all(float(v).is_integer() for v in values), values
    strings = axis.tickStrings(values, 1.0, 1.0)
    assert all("." not in s for s in strings), strings

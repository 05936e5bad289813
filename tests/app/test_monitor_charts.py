"""Monitor charts read cleanly: legends sit above the plots (no curve runs through them) and learning-rate ticks
share one power of ten."""

from __future__ import annotations

import math
import re
import time

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication

from hone.core.events import RunStarted, StepMetrics

GIB = 2**30
TOTAL = 100


def _settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        QApplication.processEvents()


def _rect_in(widget, ancestor) -> QRect:
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def _cosine_run(monitor, t0: float) -> list[float]:
    """A run of TOTAL steps with the usual cosine schedule from 2e-4 to 0, memory rising to the top right."""
    monitor.handle(
        RunStarted(
            run_dir="/runs/r",
            model="tiny",
            device="cuda",
            dtype="bfloat16",
            params_total=10,
            params_trainable=1,
            total_steps=TOTAL,
            tokens_per_epoch=100,
            time=t0,
        )
    )
    lrs = [1e-4 * (1 + math.cos(math.pi * s / TOTAL)) for s in range(1, TOTAL + 1)]
    for s, lr in enumerate(lrs, 1):
        monitor.handle(
            StepMetrics(
                step=s,
                total_steps=TOTAL,
                epoch=s / TOTAL,
                loss=1.0,
                lr=lr,
                grad_norm=1.0,
                tokens=10,
                trained_tokens=5,
                tokens_per_s=100.0,
                step_time=0.1,
                elapsed=0.1 * s,
                mem_allocated=s * GIB // 10,
                mem_reserved=(s + 5) * GIB // 10,
                time=t0 + 0.1 * s,
            )
        )
    monitor.flush()
    _settle()
    return lrs


@pytest.mark.parametrize("size", [(1280, 820), (980, 640)])
def test_the_memory_legend_sits_above_the_plot_not_on_it(make_window, size):
    window = make_window()
    window.resize(*size)
    window.show_page("monitor")
    chart = window.monitor.memory_chart
    _cosine_run(window.monitor, time.time())
    item = chart.plot.getPlotItem()
    assert item.legend is None, "no legend item inside the plot, where curves run"
    assert chart.legend.isVisibleTo(window)
    assert [name for name, _ in chart.legend_entries()] == ["device used", "reserved", "allocated (peak)"]
    legend, plot = _rect_in(chart.legend, chart), _rect_in(chart.plot, chart)
    assert legend.bottom() < plot.top(), f"legend {legend.getRect()} overlaps the plot {plot.getRect()}"
    assert legend.left() >= plot.left() - 1 and legend.right() <= plot.right() + 1, "as wide as the plot at most"
    # every curve point is drawn inside the view box, which the legend is not part of
    view = chart.plot.mapFromScene(item.getViewBox().sceneBoundingRect()).boundingRect()
    assert not QRect(view.x() + plot.x(), view.y() + plot.y(), view.width(), view.height()).intersects(legend)


def test_the_legend_takes_the_palette_and_the_names_given(window):
    chart = window.monitor.memory_chart
    palette = window.theme.palette
    text = chart.legend.text()
    for colour in (palette.mem_device, palette.mem_reserved, palette.mem_alloc):
        assert colour in text, "each entry's sample has its curve's colour"
    window.theme.set_mode("light" if palette.is_dark else "dark")
    assert window.theme.palette.mem_device in chart.legend.text()
    window.theme.set_mode("system")


SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")


def _parse(tick: str) -> tuple[float, int | None]:
    """'1.5×10⁻⁴' -> (1.5, -4); '0' -> (0.0, None). Written apart from the app's formatter."""
    if tick == "0":
        return 0.0, None
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)×10([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)", tick)
    assert match, f"{tick!r} is not mantissa×10ⁿ"
    return float(match.group(1)), int(match.group(2).translate(SUPERSCRIPT))


def test_learning_rate_ticks_share_one_power_of_ten(window):
    window.show_page("monitor")
    lrs = _cosine_run(window.monitor, time.time())
    axis = window.monitor.lr_chart.plot.getPlotItem().getAxis("left")
    low, high = axis.range
    assert low <= min(lrs) and high >= max(lrs)
    levels = axis.tickValues(low, high, axis.height())  # as the axis lays them out before it draws them
    assert levels, "the axis has ticks"
    strings = [s for spacing, values in levels for s in axis.tickStrings(values, 1.0, spacing)]
    values = [v for _, level in levels for v in level]
    assert not any("e" in s for s in strings), strings
    parsed = [_parse(s) for s in strings]
    assert {exponent for _, exponent in parsed} - {None} == {-4}, f"one power of ten on the axis: {strings}"
    for value, (mantissa, _) in zip(values, parsed):
        assert mantissa * 1e-4 == pytest.approx(value, abs=1e-12), (value, strings)
    decimals = {len(s.split("×")[0].partition(".")[2]) for s in strings if s != "0"}
    assert decimals == {1}, f"every mantissa with one decimal, so they line up: {strings}"
    # a 2e-4 -> 0 schedule's levels as pyqtgraph spaces them: whole ×10⁻⁴, halves, tenths; a quarter needs two
    assert axis.tickStrings([0.0, 1e-4, 2e-4], 1.0, 1e-4) == ["0", "1.0×10⁻⁴", "2.0×10⁻⁴"]
    assert axis.tickStrings([5e-5, 1.5e-4], 1.0, 5e-5) == ["0.5×10⁻⁴", "1.5×10⁻⁴"]
    assert axis.tickStrings([1e-5, 2e-5], 1.0, 1e-5) == ["0.1×10⁻⁴", "0.2×10⁻⁴"]
    assert axis.tickStrings([2.5e-5, 7.5e-5], 1.0, 2.5e-5) == ["0.25×10⁻⁴", "0.75×10⁻⁴"]
    assert window.monitor.lr_chart.headline.text() == "0", "the last step's learning rate, in the same form"


def test_the_learning_rate_headline_reads_like_its_ticks(window):
    window.show_page("monitor")
    monitor = window.monitor
    t0 = time.time()
    monitor.handle(
        RunStarted(
            run_dir="/runs/r",
            model="tiny",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=10,
            tokens_per_epoch=100,
            time=t0,
        )
    )
    monitor.handle(
        StepMetrics(
            step=1,
            total_steps=10,
            epoch=0.1,
            loss=1.0,
            lr=1.5e-4,
            grad_norm=1.0,
            tokens=10,
            trained_tokens=5,
            tokens_per_s=100.0,
            step_time=0.1,
            elapsed=0.1,
            time=t0 + 0.1,
        )
    )
    monitor.flush()
    assert monitor.lr_chart.headline.text() == "1.50×10⁻⁴"

"""Live pyqtgraph charts: each curve is created once and fed from growing numpy buffers.

Points are appended as events arrive (cheap: a numpy write), or a run's worth at once (`extend`); `flush()` hands
the dirty curves to pyqtgraph, thinned to what a chart can show (hone.core.api.downsample: a million steps draw as a
few thousand points, every bucket's lowest and highest kept, the newest exactly). The page calls `flush()` from one
QTimer (~10 Hz), so a burst of hundreds of steps per second costs ten redraws, not hundreds. A chart's legend is a
line of text above its plot, where no curve can run through it.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QLabel, QWidget

from hone.app.theme import Palette
from hone.app.widgets.common import Card
from hone.core.api import downsample


class StepAxis(pg.AxisItem):
    """An x axis of optimizer steps: ticks only at whole steps (no 1.5 or 2.5 while a run is short)."""

    def tickValues(self, minVal, maxVal, size):
        levels = []
        for spacing, values in super().tickValues(minVal, maxVal, size):
            if spacing >= 1:
                levels.append((spacing, values))
            else:  # finer than a step: the whole steps in view instead
                levels.append((1.0, [float(v) for v in range(int(np.ceil(minVal)), int(np.floor(maxVal)) + 1)]))
                break
        return levels


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(value: float, exponent: int | None = None, decimals: int = 2) -> str:
    """`value` as mantissa×10ⁿ: power_of_ten(1.5e-4) == "1.50×10⁻⁴"; power_of_ten(5e-5, -4, 1) == "0.5×10⁻⁴" (a
    given exponent keeps values side by side comparable); 0 is "0"."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if exponent is None:
        exponent = math.floor(math.log10(abs(value)))
        if round(abs(value) / 10.0**exponent, decimals) >= 10:  # 9.999e-5 rounds up to 10.00×10⁻⁵: say 1.00×10⁻⁴
            exponent += 1
    return f"{value / 10.0**exponent:.{decimals}f}×10{str(exponent).translate(_SUPERSCRIPT)}"


class PowerOfTenAxis(pg.AxisItem):
    """A y axis for values far below 1 (learning rates): every tick reads mantissa×10ⁿ with one n for the whole
    axis, that of the largest value in view, so 0.5×10⁻⁴ and 2.0×10⁻⁴ compare at a glance."""

    def tickStrings(self, values, scale, spacing):
        top = max(abs(float(v)) for v in self.range)
        if not values or not top or not math.isfinite(top) or spacing <= 0:
            return super().tickStrings(values, scale, spacing)
        exponent = math.floor(math.log10(top))
        # As many decimals as the level's spacing needs (0.5×10⁻⁴ one, 0.25×10⁻⁴ two) and at least one, so the
        # whole steps of a coarser level (1.0×10⁻⁴) line up with the halves and tenths pyqtgraph puts between them.
        step = spacing * scale / 10.0**exponent
        decimals = next((d for d in range(1, 8) if abs(round(step, d) - step) <= 1e-6 * step), 8)
        return [power_of_ten(v * scale, exponent, decimals) for v in values]


def plot_widget(min_height: int, steps: bool = False, power_of_ten_axis: bool = False) -> pg.PlotWidget:
    """A pyqtgraph plot as every chart here uses it: no context menu, no auto-range button; `steps` puts whole
    optimizer steps on the x axis, labelled so; `power_of_ten_axis` writes the y ticks as mantissa×10ⁿ."""
    axes = {}
    if steps:
        axes["bottom"] = StepAxis("bottom")
    if power_of_ten_axis:
        axes["left"] = PowerOfTenAxis("left")
    plot = pg.PlotWidget(axisItems=axes or None)
    if steps:
        plot.getPlotItem().setLabel("bottom", "step")
    plot.setMinimumHeight(min_height)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    return plot


def _headline(card: Card) -> QLabel:
    """The value shown at the right of a chart card's title."""
    headline = QLabel("")
    headline.setObjectName("StatDetail")
    card.header.addWidget(headline, 0, Qt.AlignRight | Qt.AlignTop)
    return headline


class _Mark(pg.InfiniteLine):
    """A vertical line marking an x (a change during the run). It counts in the x auto-range, so a mark at the
    run's start is in view even before the first point there."""

    def dataBounds(self, axis, frac=1.0, orthoRange=None):
        return (self.value(), self.value()) if axis == 0 else None


# A mark's label is the first clause of what it marks, in at most two lines of this many characters (the whole text
# is its tooltip): written up the line in MARK_FONT_PT, a line must fit the ~150-pixel-high plot area of a chart.
MARK_LINE_CHARS = 24
MARK_FONT_PT = 8.0


def mark_label(text: str) -> str:
    """The first clause of `text` in at most two lines: "out of GPU memory at step 3: running each…" becomes
    "out of GPU memory at" and "step 3"."""
    clause = re.split(r"[:;(]", text, maxsplit=1)[0].strip()
    lines = textwrap.wrap(clause, MARK_LINE_CHARS, break_long_words=True) or [""]
    if len(lines) > 2:
        lines = [lines[0], lines[1][: MARK_LINE_CHARS - 1].rstrip() + "…"]
    return "\n".join(lines)


class SeriesBuffer:
    """x/y float64 arrays that double their capacity when full; `x`, `y` are views of the filled part."""

    def __init__(self, capacity: int = 512):
        self._x = np.empty(capacity)
        self._y = np.empty(capacity)
        self.n = 0

    def append(self, x: float, y: float) -> None:
        if self.n == len(self._x):
            self._grow(self.n + 1)
        self._x[self.n] = x
        self._y[self.n] = y
        self.n += 1

    def reserve(self, count: int) -> None:
        """Make room for `count` more points now, while few are held: growing later copies all of them at once."""
        if self.n + count > len(self._x):
            self._grow(self.n + count)

    def extend(self, xs: np.ndarray, ys: np.ndarray) -> None:
        """Append many points at once (a run read from its folder)."""
        count = len(xs)
        if self.n + count > len(self._x):
            self._grow(self.n + count)
        self._x[self.n : self.n + count] = xs
        self._y[self.n : self.n + count] = ys
        self.n += count

    def _grow(self, needed: int) -> None:
        capacity = max(2 * len(self._x), needed)
        for name in ("_x", "_y"):
            grown = np.empty(capacity)
            grown[: self.n] = getattr(self, name)[: self.n]
            setattr(self, name, grown)

    def replace(self, xs, ys) -> None:
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        self._x, self._y, self.n = xs.copy(), ys.copy(), len(xs)
        if self.n == 0:
            self._x, self._y = np.empty(512), np.empty(512)

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.n]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.n]

    def clear(self) -> None:
        self.n = 0


class _Series:
    def __init__(self, curve: pg.PlotDataItem, colour_key: str, dashed: bool, width: float, symbol: str | None):
        self.curve = curve
        self.buffer = SeriesBuffer()
        self.colour_key = colour_key
        self.dashed = dashed
        self.width = width
        self.symbol = symbol
        self.dirty = False


class LiveChart(Card):
    """A titled chart card holding named series. Colours are palette keys, so theme changes restyle it.

    Args:
        title: card title.
        unit: shown next to the latest value in the card header.
        y_format: formats the headline value (the latest point of the first series): a format string, or a
            function of the value.
        steps: the x axis counts optimizer steps (labelled "step", whole-step ticks).
        power_of_ten_axis: y ticks read mantissa×10ⁿ with one n for the axis (learning rates).
    """

    def __init__(
        self,
        title: str,
        unit: str = "",
        y_format: str | Callable[[float], str] = "{:.4g}",
        parent: QWidget | None = None,
        steps: bool = False,
        power_of_ten_axis: bool = False,
    ):
        super().__init__(title, parent=parent)
        self._unit = unit
        self._y_format = y_format
        self.headline = _headline(self)
        self.plot = plot_widget(150, steps=steps, power_of_ten_axis=power_of_ten_axis)
        item = self.plot.getPlotItem()
        item.showGrid(x=False, y=True, alpha=0.25)
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        item.getViewBox().setMouseEnabled(x=True, y=False)
        self.legend = QLabel("")  # above the plot: a legend inside it covers the data the curves reach
        self.legend.setObjectName("StatDetail")
        self.legend.setTextFormat(Qt.RichText)
        self.legend.setWordWrap(True)  # a narrow chart puts its entries on two lines rather than cut them
        self.body.addWidget(self.legend)
        self.body.addWidget(self.plot, 1)
        self.series: dict[str, _Series] = {}
        self.names: dict[str, str] = {}  # series key -> its name in the legend
        self.marks: list[pg.InfiniteLine] = []
        self._palette: Palette | None = None
        self._empty = QLabel("", self.plot)
        self._empty.setAlignment(Qt.AlignCenter)
        self._empty.setObjectName("StatDetail")

    def add_line(
        self,
        key: str,
        name: str,
        colour_key: str,
        *,
        width: float = 2.0,
        dashed: bool = False,
        symbol: str | None = None,
    ) -> None:
        """Create a curve once; its data comes from `append` / `set_points`."""
        curve = self.plot.plot([], [], name=name)
        # Drawn as separate segments: an antialiased wide pen over a connected path of thousands of zigzagging points
        # (a thinned series' bucket extremes) costs Qt's stroker up to a second of the GUI thread; segments, a few ms.
        curve.curve.setSegmentedLineMode("on")
        self.series[key] = _Series(curve, colour_key, dashed, width, symbol)
        self.names[key] = name
        if self._palette:
            self._style(self.series[key])
        self._update_legend()

    def remove_line(self, key: str) -> None:
        """Drop a curve made with `add_line` (the Monitor's per-GPU lines end with their run)."""
        series = self.series.pop(key)
        self.names.pop(key, None)
        self.plot.removeItem(series.curve)
        self._update_legend()

    def set_name(self, key: str, name: str) -> None:
        """Rename a series in the legend (the Runs page names the compared curves after their runs)."""
        self.names[key] = name
        self._update_legend()

    def legend_entries(self) -> list[tuple[str, str]]:
        """(name, colour) of each series, in the order the legend shows them."""
        return [
            (self.names[key], getattr(self._palette, series.colour_key) if self._palette else "")
            for key, series in self.series.items()
        ]

    def add_mark(self, x: float, text: str, tooltip: str = "") -> pg.InfiniteLine:
        """A vertical line at `x`, labelled along it with `text`, `tooltip` on hover. Made once and kept (through
        every redraw) until `clear()`."""
        # The label runs up the line and ends near the top of the plot, on whichever side of the line has room. It
        # would show the line's x where its text says {value}: braces of the text are doubled to stay braces.
        mark = _Mark(
            pos=x,
            angle=90,
            movable=False,
            label=text.replace("{", "{{").replace("}", "}}"),
            labelOpts={"position": 0.97, "rotateAxis": (1, 0), "anchors": [(1, 0), (1, 1)]},
        )
        font = QFont(mark.label.textItem.font())
        font.setPointSizeF(MARK_FONT_PT)
        mark.label.setFont(font)
        mark.setToolTip(tooltip)
        mark.label.setToolTip(tooltip)
        mark.setZValue(-10)  # behind the curves
        self.plot.addItem(mark)
        self.marks.append(mark)
        if self._palette:
            self._style_mark(mark)
        return mark

    def append(self, key: str, x: float, y: float) -> None:
        series = self.series[key]
        series.buffer.append(x, y)
        series.dirty = True

    def extend(self, key: str, xs: np.ndarray, ys: np.ndarray) -> None:
        """Append many points at once."""
        if len(xs):
            series = self.series[key]
            series.buffer.extend(xs, ys)
            series.dirty = True

    def set_points(self, key: str, xs, ys) -> None:
        series = self.series[key]
        series.buffer.replace(xs, ys)
        series.dirty = True

    def keep_until(self, x_max: float) -> None:
        """Drop every point right of `x_max` (a resumed run redoes the steps after its checkpoint)."""
        for series in self.series.values():
            keep = series.buffer.x <= x_max
            if not keep.all():
                series.buffer.replace(series.buffer.x[keep], series.buffer.y[keep])
                series.dirty = True

    def points(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        buffer = self.series[key].buffer
        return buffer.x.copy(), buffer.y.copy()

    def flush(self) -> int:
        """Push dirty series to pyqtgraph, thinned to `downsample`'s few thousand points; returns how many curves
        were redrawn."""
        redrawn = 0
        for series in self.series.values():
            if series.dirty:
                series.curve.setData(*downsample(series.buffer.x, series.buffer.y))
                series.dirty = False
                redrawn += 1
        if redrawn:
            self._update_headline()
            if any(series.buffer.n for series in self.series.values()):
                self._empty.setVisible(False)
        return redrawn

    def clear(self) -> None:
        for series in self.series.values():
            series.buffer.clear()
            series.curve.setData([], [])
            series.dirty = False
        for mark in self.marks:
            self.plot.removeItem(mark)
        self.marks.clear()
        self.headline.setText("")

    def set_empty_text(self, text: str) -> None:
        """A hint drawn over an empty chart (e.g. 'Waiting for the first step')."""
        self._empty.setText(text)
        self._empty.setVisible(bool(text))
        self._place_empty()

    def apply_palette(self, palette: Palette) -> None:
        self._palette = palette
        self.plot.setBackground(palette.surface)
        item = self.plot.getPlotItem()
        for axis in ("left", "bottom"):
            ax = item.getAxis(axis)
            ax.setPen(pg.mkPen(palette.grid))
            ax.setTextPen(pg.mkPen(palette.muted))
        for series in self.series.values():
            self._style(series)
        for mark in self.marks:
            self._style_mark(mark)
        self._update_legend()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._place_empty()

    def _place_empty(self) -> None:
        # over the plotting area only, so the hint never sits on the axis ticks
        area = self.plot.mapFromScene(self.plot.getPlotItem().getViewBox().sceneBoundingRect()).boundingRect()
        if area.width() < 40 or area.height() < 20:  # not laid out yet
            area = self.plot.rect()
        self._empty.setGeometry(area)
        self._empty.setWordWrap(True)

    def _style(self, series: _Series) -> None:
        colour = getattr(self._palette, series.colour_key)
        pen = pg.mkPen(colour, width=series.width, style=Qt.DashLine if series.dashed else Qt.SolidLine)
        series.curve.setPen(pen)
        if series.symbol:
            series.curve.setSymbol(series.symbol)
            series.curve.setSymbolSize(7)
            series.curve.setSymbolBrush(pg.mkBrush(colour))
            series.curve.setSymbolPen(pg.mkPen(self._palette.surface, width=1.5))

    def _style_mark(self, mark: pg.InfiniteLine) -> None:
        mark.setPen(pg.mkPen(self._palette.warning, width=1.2, style=Qt.DashLine))
        mark.label.setColor(self._palette.warning)
        backdrop = pg.mkColor(self._palette.surface)
        backdrop.setAlpha(200)  # readable where the label crosses a curve, which still shows through
        mark.label.fill = pg.mkBrush(backdrop)
        mark.label.update()

    def _update_legend(self) -> None:
        """One entry per series: a sample drawn like its curve (solid, dashed, with its symbol), then its name."""
        entries = []
        for key, series in self.series.items():
            sample = "╍╍" if series.dashed else "━●━" if series.symbol else "━━"
            colour = getattr(self._palette, series.colour_key) if self._palette else ""
            name = html.escape(self.names[key]).replace(" ", "&nbsp;")  # an entry never breaks across lines
            entries.append(
                f'<span style="color:{colour}">{sample}</span>&nbsp;{name}' if colour else f"{sample}&nbsp;{name}"
            )
        self.legend.setText("&nbsp;&nbsp; ".join(entries))
        self.legend.setVisible(bool(entries))

    def _update_headline(self) -> None:
        first = next(iter(self.series.values()), None)
        if first and first.buffer.n:
            latest = float(first.buffer.y[-1])
            value = self._y_format(latest) if callable(self._y_format) else self._y_format.format(latest)
            self.headline.setText(f"{value} {self._unit}".strip())


class BarChart(Card):
    """Bars with a fixed count set on first data (the MoE expert load: tokens routed to each expert)."""

    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(title, parent=parent)
        self.headline = _headline(self)
        self.plot = plot_widget(150)
        self.plot.getPlotItem().getViewBox().setMouseEnabled(x=False, y=False)
        self.body.addWidget(self.plot, 1)
        self.bars: pg.BarGraphItem | None = None
        self.values = np.zeros(0)
        self._dirty = False
        self._palette: Palette | None = None

    def set_values(self, values) -> None:
        self.values = np.asarray(values, dtype=float)
        self._dirty = True

    def flush(self) -> int:
        if not self._dirty:
            return 0
        self._dirty = False
        x = np.arange(len(self.values))
        if self.bars is None or len(self.bars.opts["x"]) != len(x):
            if self.bars is not None:
                self.plot.removeItem(self.bars)
            self.bars = pg.BarGraphItem(x=x, height=self.values, width=0.8)
            self.plot.addItem(self.bars)
            self._style()
        else:
            self.bars.setOpts(height=self.values)
        total = self.values.sum()
        if total > 0:
            # max/mean load: 1.0 is perfectly balanced routing, E means all tokens went to one expert
            self.headline.setText(f"max/mean {self.values.max() / self.values.mean():.2f}")
        return 1

    def clear(self) -> None:
        if self.bars is not None:
            self.plot.removeItem(self.bars)
            self.bars = None
        self.values = np.zeros(0)
        self.headline.setText("")

    def apply_palette(self, palette: Palette) -> None:
        self._palette = palette
        self.plot.setBackground(palette.surface)
        for axis in ("left", "bottom"):
            ax = self.plot.getPlotItem().getAxis(axis)
            ax.setPen(pg.mkPen(palette.grid))
            ax.setTextPen(pg.mkPen(palette.muted))
        self._style()

    def _style(self) -> None:
        if self.bars is not None and self._palette:
            self.bars.setOpts(brush=pg.mkBrush(self._palette.loss), pen=pg.mkPen(None))

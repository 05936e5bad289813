"""Live pyqtgraph charts: each curve is created once and fed from growing numpy buffers.

Points are appended as events arrive (cheap: a numpy write); `flush()` hands the dirty curves to pyqtgraph.
The page calls `flush()` from one QTimer (~10 Hz), so a burst of hundreds of steps per second costs ten
redraws, not hundreds.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from hone.app.theme import Palette
from hone.app.widgets.common import Card


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


def plot_widget(min_height: int, steps: bool = False) -> pg.PlotWidget:
    """A pyqtgraph plot as every chart here uses it: no context menu, no auto-range button; `steps` puts whole
    optimizer steps on the x axis, labelled so."""
    plot = pg.PlotWidget(axisItems={"bottom": StepAxis("bottom")} if steps else None)
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

class SeriesBuffer:
    """x/y float64 arrays that double their capacity when full; `x`, `y` are views of the filled part."""

    def __init__(self, capacity: int = 512):
        self._x = np.empty(capacity)
        self._y = np.empty(capacity)
        self.n = 0

    def append(self, x: float, y: float) -> None:
        if self.n == len(self._x):
            self._x = np.concatenate([self._x, np.empty(len(self._x))])
            self._y = np.concatenate([self._y, np.empty(len(self._y))])
        self._x[self.n] = x
        self._y[self.n] = y
        self.n += 1

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
        y_format: formats the headline value (the latest point of the first series).
        steps: the x axis counts optimizer steps (labelled "step", whole-step ticks).
    """

    def __init__(self, title: str, unit: str = "", y_format: str = "{:.4g}", parent: QWidget | None = None,
                 steps: bool = False):
        super().__init__(title, parent=parent)
        self._unit = unit
        self._y_format = y_format
        self.headline = _headline(self)
        self.plot = plot_widget(150, steps=steps)
        item = self.plot.getPlotItem()
        item.showGrid(x=False, y=True, alpha=0.25)
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        item.getViewBox().setMouseEnabled(x=True, y=False)
        self.legend = item.addLegend(offset=(-8, 8), labelTextSize="8pt")
        self.body.addWidget(self.plot, 1)
        self.series: dict[str, _Series] = {}
        self._palette: Palette | None = None
        self._empty = QLabel("", self.plot)
        self._empty.setAlignment(Qt.AlignCenter)
        self._empty.setObjectName("StatDetail")

    def add_line(self, key: str, name: str, colour_key: str, *, width: float = 2.0, dashed: bool = False,
                 symbol: str | None = None) -> None:
        """Create a curve once; its data comes from `append` / `set_points`."""
        curve = self.plot.plot([], [], name=name)
        self.series[key] = _Series(curve, colour_key, dashed, width, symbol)
        if self._palette:
            self._style(self.series[key])

    def append(self, key: str, x: float, y: float) -> None:
        series = self.series[key]
        series.buffer.append(x, y)
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
        """Push dirty series to pyqtgraph; returns how many curves were redrawn."""
        redrawn = 0
        for series in self.series.values():
            if series.dirty:
                series.curve.setData(series.buffer.x, series.buffer.y)
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
        self.legend.setLabelTextColor(palette.muted)
        for series in self.series.values():
            self._style(series)

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
        # the legend samples read the curve's pen, refresh them
        for sample, _label in self.legend.items:
            sample.update()

    def _update_headline(self) -> None:
        first = next(iter(self.series.values()), None)
        if first and first.buffer.n:
            value = self._y_format.format(first.buffer.y[-1])
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

"""The Data page's token-length histogram: a bar per length bin over every kept row, a line at data.max_length,
and a note with the row count and the mean length under it.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QVBoxLayout, QWidget

from hone.app.theme import Palette
from hone.app.widgets.charts import plot_widget
from hone.app.widgets.common import label

# Histogram bins for the token lengths.
HISTOGRAM_BINS = 40
# What the chart says before a check has counted any tokens.
NOT_CHECKED = "Press Check data to see how many tokens each row has."


class LengthHistogram(QWidget):
    """The histogram (`plot`), the bars drawn now (`bars`, None before a check), the max-length line and the note."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.plot = plot_widget(180)
        self.plot.setMaximumHeight(220)  # the files beside it set the row's height
        self.plot.getPlotItem().getViewBox().setMouseEnabled(x=False, y=False)
        self.plot.getPlotItem().setLabel("bottom", "tokens per row")
        self.plot.getPlotItem().setLabel("left", "rows")
        self.bars: pg.BarGraphItem | None = None
        self.limit_line = pg.InfiniteLine(angle=90, movable=False)
        self.plot.addItem(self.limit_line)
        layout.addWidget(self.plot)
        self.note = label("", "muted")
        layout.addWidget(self.note)
        # Without lengths the chart says what to do: its axes would only span the max-length line (2047.6-2048.4).
        self.empty = label(NOT_CHECKED, "muted", wrap=True)
        self.empty.setParent(self.plot)
        self.empty.setAlignment(Qt.AlignCenter)
        self._show_empty(NOT_CHECKED)

    def draw(self, lengths: np.ndarray, limit: int, colour: str, why: str = "") -> None:
        """Bars over `lengths` (tokens per kept row), the line at `limit` (data.max_length); without lengths, `why`
        (default: press Check data) in place of the chart."""
        if self.bars is not None:
            self.plot.removeItem(self.bars)
            self.bars = None
        self.limit_line.setValue(limit)
        if lengths.size == 0:
            self.note.setText("")
            self._show_empty(why or NOT_CHECKED)
            return
        self._show_empty("")
        counts, edges = np.histogram(lengths, bins=min(HISTOGRAM_BINS, max(1, int(np.ptp(lengths)) + 1)))
        self.bars = pg.BarGraphItem(
            x0=edges[:-1], x1=edges[1:], height=counts, brush=pg.mkBrush(colour), pen=pg.mkPen(None)
        )
        self.plot.addItem(self.bars)
        self.note.setText(
            f"{lengths.size:,} rows · mean {lengths.mean():,.0f} tokens · the line marks max length ({limit:,})"
        )

    def _show_empty(self, text: str) -> None:
        self.empty.setText(text)
        self.empty.setVisible(bool(text))
        item = self.plot.getPlotItem()
        for axis in ("left", "bottom"):
            item.showAxis(axis, not text)
        self.limit_line.setVisible(not text)
        self.empty.setGeometry(self.plot.rect())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.empty.setGeometry(self.plot.rect())

    def apply_palette(self, palette: Palette) -> None:
        self.plot.setBackground(palette.surface)
        for axis in ("left", "bottom"):
            ax = self.plot.getPlotItem().getAxis(axis)
            ax.setPen(pg.mkPen(palette.grid))
            ax.setTextPen(pg.mkPen(palette.muted))
        self.limit_line.setPen(pg.mkPen(palette.danger, width=1.5, style=Qt.DashLine))
        if self.bars is not None:
            self.bars.setOpts(brush=pg.mkBrush(palette.loss))

"""The Runs page's comparison of several runs: their loss, eval loss, speed and GPU memory overlaid against steps or
tokens seen, a table of only the settings that differ, and a table of each run's numbers (the columns of
`hone compare`).

The run folders are read on a Task's thread (hone.core.api.compare_runs); a damaged file is said in words under the
charts, and the other runs are compared as far as their files allow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from hone.app.run_status import status_word
from hone.app.task_errors import TaskError
from hone.app.theme import Palette
from hone.app.widgets.charts import LiveChart
from hone.app.widgets.common import Card, Columns, label, set_role
from hone.app.workers import Task
from hone.core.api import METRIC_COLUMNS, RunComparison, RunSeries, compare_runs, metric_text, setting_text

# One palette key per compared run, hues far apart in both themes; their count is how many runs may be compared
# (a ninth colour would repeat one, and a legend of nine names no longer reads at a glance).
RUN_COLOURS = ("loss", "smooth", "eval", "speed", "mem_alloc", "util", "danger", "muted")
MAX_COMPARED = len(RUN_COLOURS)
GIB = 1024**3
STEPS, TOKENS = "steps", "tokens"  # what the charts' x axis counts
X_LABELS = {STEPS: "step", TOKENS: "tokens seen"}
# (key, title, unit, headline format, what the chart says when no run has a point)
CHARTS = (
    ("loss", "Loss", "", "{:.4f}", "No run has recorded a step."),
    ("eval", "Eval loss", "", "{:.4f}", "No run was evaluated (Train > train.eval_every)."),
    ("speed", "Tokens/s", "tok/s", "{:,.0f}", "No run has recorded its speed."),
    ("memory", "GPU memory allocated", "GiB", "{:.2f}", "No run recorded GPU memory (runs on the CPU report none)."),
)
HINT = (
    f"Select two to {MAX_COMPARED} runs above and press Compare: their loss, eval loss, speed and memory side by "
    "side, the settings that differ, and each run's numbers."
)


def chart_points(series: RunSeries, chart: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) float64 points a run draws in `chart` (a key of CHARTS) against `x` (STEPS or TOKENS). Points with
    no value to draw are left out: a NaN loss, a speed of 0, memory a CPU run did not report (0)."""
    if chart == "eval":
        xs = series.eval_step if x == STEPS else series.eval_tokens_seen
        ys = np.asarray(series.eval_loss, dtype=float)
    else:
        xs = series.step if x == STEPS else series.tokens_seen
        ys = {
            "loss": lambda: np.asarray(series.loss, dtype=float),
            "speed": lambda: np.asarray(series.tokens_per_s, dtype=float),
            "memory": lambda: np.asarray(series.mem_allocated, dtype=float) / GIB,
        }[chart]()
    xs_array = np.asarray(xs, dtype=float)
    keep = np.isfinite(ys)
    if chart in ("speed", "memory"):
        keep &= ys > 0
    return xs_array[keep], ys[keep]


def _table(columns: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().hide()
    table.setEditTriggers(QAbstractItemView.NoEditTriggers)
    table.setSelectionMode(QAbstractItemView.NoSelection)
    table.setAlternatingRowColors(True)
    table.setShowGrid(False)
    table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # as tall as its rows: the page scrolls, not the table
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    return table


def _fit_rows(table: QTableWidget) -> None:
    """Make `table` exactly as tall as its header and rows (and a horizontal scroll bar, when one shows)."""
    table.resizeRowsToContents()
    height = table.horizontalHeader().height() + sum(table.rowHeight(r) for r in range(table.rowCount()))
    table.setFixedHeight(height + 2 * table.frameWidth() + table.horizontalScrollBar().sizeHint().height())


def _item(text: str, right: bool = False, tooltip: str = "") -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    if right:
        item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
    if tooltip:
        item.setToolTip(tooltip)
    return item


class RunComparisonView(QWidget):
    """Several runs side by side. `compare(run_dirs)` reads them off the GUI thread; `comparison` is the last one
    shown (None before the first)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.comparison: RunComparison | None = None
        self.x = STEPS
        self.reading = False
        self._token = 0  # the newest request: an older one's result, arriving late, is dropped
        self._palette: Palette | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(14)

        top = Card("Comparison")
        self.x_buttons: dict[str, QPushButton] = {}
        self.x_group = QButtonGroup(self)
        for kind, text, tip in (
            (STEPS, "Steps", "Draw every chart against the optimizer step."),
            (
                TOKENS,
                "Tokens seen",
                "Draw every chart against the tokens trained on so far: runs with other "
                "batch sizes line up by how much data they have seen.",
            ),
        ):
            button = set_role(QPushButton(text), "preset")
            button.setCheckable(True)
            button.setToolTip(tip)
            button.clicked.connect(lambda _=False, kind=kind: self.set_x(kind))
            self.x_group.addButton(button)
            self.x_buttons[kind] = button
            top.header.addWidget(button)
        self.x_buttons[STEPS].setChecked(True)
        self.status = label(HINT, "muted", wrap=True)
        self.problems = label("", "error", wrap=True, selectable=True)
        self.problems.setTextFormat(Qt.PlainText)  # problems quote file contents and paths
        top.body.addWidget(self.status)
        top.body.addWidget(self.problems)
        layout.addWidget(top)

        self.charts: dict[str, LiveChart] = {}
        self.chart_grid = Columns(2)
        for key, title, unit, y_format, _empty in CHARTS:
            chart = LiveChart(title, unit=unit, y_format=y_format, steps=True)
            chart.headline.hide()  # it would show the first run's latest value, which says nothing of the others
            chart.plot.setMinimumHeight(200)
            self.charts[key] = chart
            self.chart_grid.add(chart)
        layout.addWidget(self.chart_grid)

        self.settings_card = Card("Settings that differ")
        self.same = label("", "muted", wrap=True)
        self.settings_table = _table(["setting"])
        self.settings_card.body.addWidget(self.same)
        self.settings_card.body.addWidget(self.settings_table)
        layout.addWidget(self.settings_card)

        self.metrics_card = Card("Numbers")
        self.metrics_table = _table(["run", *(header for _key, header in METRIC_COLUMNS)])
        self.metrics_card.body.addWidget(self.metrics_table)
        layout.addWidget(self.metrics_card)
        self._show_parts(False)

    # ---- reading ----
    def compare(self, run_dirs: list[Path]) -> None:
        """Read `run_dirs` (at most MAX_COMPARED) on a Task's thread, then show them; what is shown meanwhile stays."""
        folders = [str(d) for d in run_dirs[:MAX_COMPARED]]
        self._token += 1
        token = self._token
        self.reading = True
        self.status.setText(f"Reading {len(folders)} runs…")
        self.status.show()
        Task(
            compare_runs,
            folders,
            on_result=lambda got: self._got(token, got),
            on_error=lambda error: self._failed(token, error),
        )

    def _got(self, token: int, comparison: RunComparison) -> None:
        if not isValid(self) or token != self._token:
            return
        self.reading = False
        self.show_comparison(comparison)

    def _failed(self, token: int, error: TaskError) -> None:
        if not isValid(self) or token != self._token:
            return
        self.reading = False
        advice = f" What to do: {error.advice}" if error.advice else ""
        self.status.setText(f"The runs could not be compared: {error.message}.{advice}")
        self.status.show()

    # ---- showing ----
    def show_comparison(self, comparison: RunComparison) -> None:
        """Draw `comparison`: one line per run in each chart, its settings and numbers in the tables."""
        self.comparison = comparison
        runs = comparison.runs
        self.status.setText("")
        self.status.hide()
        problems = [f"{run.name}: {problem}" for run in runs for problem in run.problems]
        self.problems.setText("\n".join(problems))
        self.problems.setVisible(bool(problems))
        for chart in self.charts.values():
            for key in list(chart.series):
                chart.remove_line(key)
            for i, run in enumerate(runs):
                chart.add_line(
                    f"run{i}", run.name, RUN_COLOURS[i], symbol="o" if chart is self.charts["eval"] else None
                )
        self._draw()
        self._fill_settings(comparison)
        self._fill_metrics(comparison)
        self._show_parts(True)

    def set_x(self, kind: str) -> None:
        """Draw the charts against STEPS or TOKENS."""
        self.x = kind
        self.x_buttons[kind].setChecked(True)
        self._draw()

    def _draw(self) -> None:
        if self.comparison is None:
            return
        for key, _title, _unit, _format, empty in CHARTS:
            chart = self.charts[key]
            drawn = 0
            for i, run in enumerate(self.comparison.runs):
                xs, ys = chart_points(run.series, key, self.x)
                chart.set_points(f"run{i}", xs, ys)
                drawn += len(xs)
            chart.plot.getPlotItem().setLabel("bottom", X_LABELS[self.x])
            chart.flush()
            chart.set_empty_text("" if drawn else empty)
            chart.plot.getPlotItem().enableAutoRange()

    def _fill_settings(self, comparison: RunComparison) -> None:
        runs, differing = comparison.runs, comparison.differing
        readable = sum(1 for run in runs if run.settings)
        if readable < 2:
            self.same.setText(
                "The settings cannot be compared: fewer than two of these runs' config.toml could be read."
            )
        else:
            self.same.setText("" if differing else "Every setting is the same in these runs.")
        self.same.setVisible(not differing)
        table = self.settings_table
        table.setColumnCount(1 + len(runs))
        table.setHorizontalHeaderLabels(["setting", *(run.name for run in runs)])
        table.setRowCount(len(differing))
        for row, (key, values) in enumerate(differing.items()):
            table.setItem(row, 0, _item(key))
            for col, (run, value) in enumerate(zip(runs, values), 1):
                unread = "" if run.settings else "its config.toml could not be read"
                table.setItem(row, col, _item(setting_text(value), tooltip=unread))
        table.setVisible(bool(differing))
        _fit_rows(table)
        self._colour_names()

    def _fill_metrics(self, comparison: RunComparison) -> None:
        table = self.metrics_table
        table.setRowCount(len(comparison.runs))
        for row, run in enumerate(comparison.runs):
            table.setItem(row, 0, _item(run.name, tooltip=run.run_dir))
            status = run.metrics.get("status", "")
            table.setItem(row, 1, _item(status_word(status), tooltip="\n".join(run.problems)))
            for col, (key, _header) in enumerate(METRIC_COLUMNS[1:], 2):
                table.setItem(row, col, _item(metric_text(key, run.metrics), right=True))
        _fit_rows(table)
        self._colour_names()

    def _colour_names(self) -> None:
        """Each run's name in its lines' colour, in both tables, so a row or column reads as its curve."""
        if self._palette is None or self.comparison is None:
            return
        for i, _run in enumerate(self.comparison.runs):
            colour = QColor(getattr(self._palette, RUN_COLOURS[i]))
            name = self.metrics_table.item(i, 0)
            if name is not None:
                name.setForeground(colour)
            header = self.settings_table.horizontalHeaderItem(i + 1)
            if header is not None:
                header.setForeground(colour)

    def _show_parts(self, shown: bool) -> None:
        for part in (self.chart_grid, self.settings_card, self.metrics_card):
            part.setVisible(shown)

    def run_names(self) -> list[str]:
        return [run.name for run in self.comparison.runs] if self.comparison is not None else []

    def settings_rows(self) -> dict[str, list[str]]:
        """The settings table as shown: setting -> each run's value in words."""
        table = self.settings_table
        return {
            table.item(row, 0).text(): [table.item(row, col).text() for col in range(1, table.columnCount())]
            for row in range(table.rowCount())
        }

    def metrics_rows(self) -> list[dict[str, Any]]:
        """The numbers table as shown: one {header: text} per run."""
        table = self.metrics_table
        headers = [table.horizontalHeaderItem(col).text() for col in range(table.columnCount())]
        return [
            {headers[col]: table.item(row, col).text() for col in range(table.columnCount())}
            for row in range(table.rowCount())
        ]

    def apply_palette(self, palette: Palette) -> None:
        self._palette = palette
        for chart in self.charts.values():
            chart.apply_palette(palette)
        self._colour_names()

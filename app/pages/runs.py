"""Runs page: the history read from run folders, two runs' loss curves overlaid, open / resume a run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelectionModel, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from hone.app.pages.base import Page
from hone.app.theme import Palette, icon
from hone.app.widgets.charts import LiveChart
from hone.app.widgets.common import Card, label, set_role
from hone.core.events import StepMetrics

COLUMNS = ("Run", "Model", "Status", "Steps", "Final loss", "Started")
OVERLAY_KEYS = ("first", "second")


def loss_curve(run_dir: str | Path) -> tuple[list[int], list[float]]:
    """(steps, losses) of a run, from its metrics.jsonl."""
    from hone.core.train.run_dir import read_events

    steps, losses = [], []
    for event in read_events(run_dir):
        if isinstance(event, StepMetrics):
            steps.append(event.step)
            losses.append(event.loss)
    return steps, losses


class RunsPage(Page):
    name = "runs"
    title = "Runs"
    subtitle = "Every run in the runs folder. Select one to open or resume it, two to compare their loss."
    icon_name = "runs"

    open_requested = Signal(str)  # run dir

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.summaries: list[Any] = []
        self.folder_button = QPushButton("Runs folder…")
        self.folder_button.clicked.connect(self._pick_folder)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.header.actions.addWidget(self.folder_button)
        self.header.actions.addWidget(self.refresh_button)

        history = Card("History")
        self.folder_label = label("", "muted", selectable=True)
        history.body.addWidget(self.folder_label)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setMinimumHeight(220)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        history.body.addWidget(self.table)
        actions = QHBoxLayout()
        self.open_button = QPushButton("Open in Monitor")
        self.open_button.clicked.connect(self.open_selected)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setToolTip("Continue the run from its last checkpoint.")
        self.resume_button.clicked.connect(self.resume_selected)
        self.compare_button = set_role(QPushButton("Compare loss"), "primary")
        self.compare_button.clicked.connect(self.compare_selected)
        self.files_button = QPushButton("Show files")
        self.files_button.clicked.connect(self._open_folder)
        for button in (self.open_button, self.resume_button, self.compare_button, self.files_button):
            actions.addWidget(button)
        actions.addStretch(1)
        self.empty = label("", "muted", wrap=True)
        history.body.addLayout(actions)
        history.body.addWidget(self.empty)
        self.body.addWidget(history)

        self.overlay = LiveChart("Loss comparison", y_format="{:.4f}")
        self.overlay.add_line("first", "first run", "loss")
        self.overlay.add_line("second", "second run", "smooth")
        self.overlay.plot.setMinimumHeight(240)
        self.overlay.set_empty_text("Select two runs and press Compare loss")
        self.body.addWidget(self.overlay)
        self.body.addStretch(1)
        state.session.running_changed.connect(lambda running: None if running else self.refresh())
        self.refresh()
        self._selection_changed()

    # ---- history ----
    @property
    def runs_dir(self) -> Path:
        return Path(self.state.config.output.runs_dir)

    def refresh(self) -> None:
        from hone.core.train.run_dir import list_runs

        self.folder_label.setText(str(self.runs_dir))
        self.summaries = list_runs(self.runs_dir) if self.runs_dir.is_dir() else []
        self.table.setRowCount(len(self.summaries))
        for row, summary in enumerate(self.summaries):
            for col, text in enumerate(_row_texts(summary)):
                item = QTableWidgetItem(text)
                if col in (3, 4):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(row, col, item)
        self.empty.setText("" if self.summaries else "No runs yet. Runs you start appear here.")
        self.empty.setVisible(not self.summaries)
        self._selection_changed()

    def selected_dirs(self) -> list[Path]:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        return [Path(self.summaries[row].run_dir) for row in rows]

    def select(self, rows: list[int]) -> None:
        self.table.clearSelection()
        for row in rows:
            self.table.selectionModel().select(self.table.model().index(row, 0),
                                               QItemSelectionModel.SelectionFlag.Select
                                               | QItemSelectionModel.SelectionFlag.Rows)

    def _selection_changed(self) -> None:
        chosen = self.selected_dirs()
        busy = self.state.session.is_running
        self.open_button.setEnabled(len(chosen) == 1 and not busy)
        self.resume_button.setEnabled(len(chosen) == 1 and not busy)
        self.files_button.setEnabled(len(chosen) == 1)
        self.compare_button.setEnabled(len(chosen) == 2)

    # ---- actions ----
    def compare_selected(self) -> None:
        chosen = self.selected_dirs()[:2]
        for key, run_dir in zip(OVERLAY_KEYS, chosen):
            steps, losses = loss_curve(run_dir)
            self.overlay.set_points(key, steps, losses)
            self.overlay.series[key].curve.opts["name"] = run_dir.name
        self.overlay.legend.clear()
        for key, run_dir in zip(OVERLAY_KEYS, chosen):
            self.overlay.legend.addItem(self.overlay.series[key].curve, run_dir.name)
        self.overlay.set_empty_text("")
        self.overlay.flush()

    def open_selected(self) -> None:
        chosen = self.selected_dirs()
        if len(chosen) == 1:
            self.open_requested.emit(str(chosen[0]))

    def resume_selected(self) -> None:
        chosen = self.selected_dirs()
        if len(chosen) == 1 and not self.state.session.is_running:
            self.state.session.resume_run(chosen[0])
            self.state.page_requested.emit("monitor")

    def _open_folder(self) -> None:
        chosen = self.selected_dirs()
        if chosen:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(chosen[0])))

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Runs folder", str(self.runs_dir))
        if folder:
            self.state.update(f'output.runs_dir="{Path(folder).as_posix()}"')
            self.refresh()

    def shown(self) -> None:
        self.refresh()

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.overlay.apply_palette(palette)
        self.refresh_button.setIcon(icon("refresh", palette.text, 16))
        self.folder_button.setIcon(icon("folder", palette.text, 16))


def _row_texts(summary: Any) -> list[str]:
    started = getattr(summary, "started", None)
    final_loss = getattr(summary, "final_loss", None)
    step, total = getattr(summary, "step", 0), getattr(summary, "total_steps", 0)
    return [
        Path(summary.run_dir).name,
        _short(getattr(summary, "model", "")),
        str(getattr(summary, "status", "")),
        f"{step:,} / {total:,}" if total else f"{step:,}",
        f"{final_loss:.4f}" if isinstance(final_loss, (int, float)) else "—",
        time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if isinstance(started, (int, float)) else "—",
    ]


def _short(name: str) -> str:
    return name.removeprefix("bundled:").replace("\\", "/").rsplit("/", 1)[-1]

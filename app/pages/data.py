"""Data page: pick files, see what the validator made of every row, preview rows, inspect the trained tokens,
and the token-length histogram.

The page's widgets are here; what runs on a worker thread (the check, the preview rows, one row inspected) is
data_check.py's, the histogram data_histogram.py's, and the rows as HTML and the report in words data_views.py's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QListWidget,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from hone.app.helper_process import in_helper
from hone.app.pages.base import Page
from hone.app.pages.data_check import DataCheck, check, entry_for, inspect
from hone.app.pages.data_histogram import LengthHistogram
from hone.app.pages.data_pairs import PairInspector, is_preference_view, row_lines, rows_kind
from hone.app.pages.data_views import (
    THUMBNAIL,
    SkippedRow,
    highlight_html,
    prompt_and_response,
    report_html,
    skipped_rows,
    thumbnail,
)
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, Columns, StatTile, label, set_role
from hone.app.workers import Task, TaskError
from hone.core.config import DATA_FORMATS, DEMO_EVAL_DATA, DEMO_TRAIN_DATA

# Skipped rows listed before the list scrolls: enough to see a pattern, few enough to leave the rest of the report
# in view (the reasons table above it always shows every reason).
SKIPPED_ROWS_SHOWN = 8

FORMAT_LABELS = {
    "auto": "Auto-detect",
    "messages": "Chat messages",
    "sharegpt": "ShareGPT conversations",
    "alpaca": "Alpaca (instruction / input / output)",
    "prompt-completion": "Prompt / completion",
    "text": "Plain text (continued pretraining)",
}
DATA_FILTER = "Datasets (*.jsonl *.json *.csv *.tsv *.parquet *.arrow);;All files (*)"


class DataPage(Page):
    name = "data"
    title = "Data"
    subtitle = "Pick your training data. Every row is checked; nothing is dropped without telling you why."
    icon_name = "data"

    checked = Signal(object)  # DataCheck or TaskError
    inspected = Signal(object)  # (RowView or None, raw row text) or TaskError

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.task: Task | None = None
        self.inspect_task: Task | None = None
        self.result: DataCheck | None = None
        self.skipped: list[SkippedRow] = []
        self._inspecting: SkippedRow | None = None

        files = Card(
            "Files",
            "JSONL, JSON, CSV/TSV, Parquet, Arrow, a folder saved by Hugging Face Datasets, or a Hub dataset id.",
        )
        lists = Columns(2, stretches=(3, 2))  # one under the other where the window is too narrow
        self.train_list, train_box = self._file_list("Training", "train")
        self.eval_list, eval_box = self._file_list("Evaluation (optional)", "eval")
        for box in (train_box, eval_box):
            holder = QWidget()
            box.setContentsMargins(0, 0, 0, 0)
            holder.setLayout(box)
            lists.add(holder)
        files.body.addWidget(lists)
        options = QHBoxLayout()
        options.addWidget(label("Format"))
        self.format_box = QComboBox()
        for fmt in DATA_FORMATS:
            self.format_box.addItem(FORMAT_LABELS.get(fmt, fmt), fmt)
        self.format_box.setToolTip("How rows are read. Auto-detect looks at the columns of each file.")
        # sized for a short name, not the longest one, so the row fits the window's minimum width
        self.format_box.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.format_box.setMinimumContentsLength(14)
        self.format_box.currentIndexChanged.connect(self._format_changed)
        options.addWidget(self.format_box)
        self.demo_button = QPushButton("Use the demo data")
        self.demo_button.setToolTip("A small bundled task: extract facts from a sentence as one line of JSON.")
        self.demo_button.clicked.connect(lambda: self.set_files([DEMO_TRAIN_DATA], [DEMO_EVAL_DATA], check=True))
        options.addWidget(self.demo_button)
        options.addStretch(1)
        self.check_button = set_role(QPushButton("Check data"), "primary")
        self.check_button.clicked.connect(self.run_check)
        options.addWidget(self.check_button)
        files.body.addLayout(options)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumHeight(6)
        self.progress.hide()
        self.status = label("", "muted", wrap=True, selectable=True)
        files.body.addWidget(self.progress)
        files.body.addWidget(self.status)
        # beside the files (above the report, preview and inspector, which grow with the data) so a check's
        # lengths are in view without scrolling; under the files where the window is narrow
        lengths = Card("Token lengths")
        self.lengths_chart = LengthHistogram()
        self.histogram = self.lengths_chart.plot
        lengths.body.addWidget(self.lengths_chart)
        top = Columns(2, stretches=(3, 2))
        top.add(files)
        top.add(lengths)
        self.body.addWidget(top)

        tiles = QHBoxLayout()
        tiles.setSpacing(12)
        self.kept_tile = StatTile("Rows kept")
        self.skipped_tile = StatTile("Skipped")
        self.truncated_tile = StatTile("Truncated")
        self.tokens_tile = StatTile("Tokens per epoch")
        self.lengths_tile = StatTile("Row length")
        for tile in (self.kept_tile, self.skipped_tile, self.truncated_tile, self.tokens_tile, self.lengths_tile):
            tiles.addWidget(tile)
        self.body.addLayout(tiles)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._report_tab(), "Report")
        self.tabs.addTab(self._preview_tab(), "Preview")
        self.tabs.addTab(self._inspector_tab(), "Inspector")
        tab_card = Card()
        tab_card.body.addWidget(self.tabs)
        self.body.addWidget(tab_card, 1)

        self._show_files()
        self._show_report(None)
        state.model_info_changed.connect(self._model_changed)
        state.config_changed.connect(self._method_changed)

    # ---- building ----
    def _file_list(self, title: str, split: str) -> tuple[QListWidget, QVBoxLayout]:
        box = QVBoxLayout()
        box.setSpacing(6)
        box.addWidget(label(title, "muted"))
        files = QListWidget()
        files.setSelectionMode(QAbstractItemView.ExtendedSelection)
        files.setMinimumHeight(72)
        files.setMaximumHeight(110)
        box.addWidget(files)
        buttons = QHBoxLayout()
        add = QPushButton("Add files…")
        add.clicked.connect(lambda: self._add_files(split))
        folder = QPushButton("Add folder…")
        folder.clicked.connect(lambda: self._add_folder(split))
        remove = QPushButton("Remove")
        remove.clicked.connect(lambda: self._remove_selected(split))
        for button in (add, folder, remove):
            buttons.addWidget(button)
        buttons.addStretch(1)
        box.addLayout(buttons)
        setattr(self, f"{split}_buttons", (add, folder, remove))
        return files, box

    def _report_tab(self) -> QWidget:
        tab, layout = _tab()
        self.skipped_table = QTableWidget(0, 2)
        self.skipped_table.setHorizontalHeaderLabels(["Why rows were skipped", "Rows"])
        self._table_style(self.skipped_table)
        layout.addWidget(self.skipped_table)
        self.skipped_rows_table = QTableWidget(0, 2)
        self.skipped_rows_table.setHorizontalHeaderLabels(["Skipped row", "Why"])
        self._table_style(self.skipped_rows_table)
        self.skipped_rows_table.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)
        self.skipped_rows_table.setToolTip("Click a row to see it in the Inspector as the file holds it.")
        self.skipped_rows_table.setAccessibleName("Skipped rows and why")
        self.skipped_rows_table.itemSelectionChanged.connect(self._skipped_selected)
        layout.addWidget(self.skipped_rows_table)
        self.report_text = QTextBrowser()
        self.report_text.setMinimumHeight(140)
        layout.addWidget(self.report_text)
        return tab

    def _preview_tab(self) -> QWidget:
        tab, layout = _tab()
        self.preview_table = QTableWidget(0, 6)
        self.preview_table.setHorizontalHeaderLabels(["Row", "Prompt", "Response", "Tokens", "Trained", "Images"])
        self._table_style(self.preview_table)
        self.preview_table.setMinimumHeight(300)
        header = self.preview_table.horizontalHeader()
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setSectionResizeMode(2, QHeaderView.Stretch)
        self.preview_table.setIconSize(QSize(THUMBNAIL, THUMBNAIL))
        self.preview_table.itemSelectionChanged.connect(self._preview_selected)
        layout.addWidget(self.preview_table)
        layout.addWidget(label("Select a row to see it in the Inspector.", "muted"))
        return tab

    def _inspector_tab(self) -> QWidget:
        tab, layout = _tab()
        self.inspector_title = label("Check the data, then pick a row in the Preview.", "muted", wrap=True)
        layout.addWidget(self.inspector_title)
        self.inspector = QTextBrowser()
        self.inspector.setMinimumHeight(300)
        layout.addWidget(self.inspector)
        self.pair_inspector = PairInspector()  # preference rows: the prompt once, the answers side by side
        self.pair_inspector.hide()
        layout.addWidget(self.pair_inspector, 1)
        self.legend = label("", "muted")
        layout.addWidget(self.legend)
        return tab

    @staticmethod
    def _table_style(table: QTableWidget) -> None:
        table.verticalHeader().hide()
        table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectRows)
        table.setSelectionMode(QAbstractItemView.SingleSelection)
        table.setAlternatingRowColors(True)
        table.setShowGrid(False)
        table.setWordWrap(False)
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(
            0, QHeaderView.Stretch if table.columnCount() == 2 else QHeaderView.ResizeToContents
        )

    # ---- files ----
    def set_files(self, train: list[str], eval_files: list[str] | None = None, *, check: bool = False) -> None:
        data = self.state.config.data
        eval_files = list(data.eval) if eval_files is None else eval_files
        self.state.set_config(replace(self.state.config, data=replace(data, train=list(train), eval=list(eval_files))))
        self._show_files()
        self._show_report(None)
        if check:
            self.run_check()

    def _entries(self, split: str) -> list[str]:
        return list(getattr(self.state.config.data, split))

    def _add_files(self, split: str) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add data files", "", DATA_FILTER)
        self._add(split, paths)

    def _add_folder(self, split: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a dataset folder")
        self._add(split, [folder] if folder else [])

    def _add(self, split: str, paths: list[str]) -> None:
        if not paths:
            return
        entries = self._entries(split) + [p for p in paths if p not in self._entries(split)]
        if split == "train":
            self.set_files(entries)
        else:
            self.set_files(self._entries("train"), entries)

    def _remove_selected(self, split: str) -> None:
        files = self.train_list if split == "train" else self.eval_list
        gone = {item.text() for item in files.selectedItems()}
        entries = [e for e in self._entries(split) if _display(e) not in gone]
        if split == "train":
            self.set_files(entries)
        else:
            self.set_files(self._entries("train"), entries)

    def _show_files(self) -> None:
        data = self.state.config.data
        for files, entries in ((self.train_list, data.train), (self.eval_list, data.eval)):
            files.clear()
            for entry in entries:
                files.addItem(_display(entry))
                files.item(files.count() - 1).setToolTip(entry)
        index = self.format_box.findData(data.format)
        self.format_box.blockSignals(True)
        self.format_box.setCurrentIndex(max(0, index))
        self.format_box.blockSignals(False)
        self.check_button.setEnabled(bool(data.train))

    def _format_changed(self) -> None:
        data = self.state.config.data
        self.state.set_config(replace(self.state.config, data=replace(data, format=self.format_box.currentData())))
        self._show_report(None)

    # ---- checking ----
    def run_check(self) -> None:
        """Validate and tokenize the training data with the chosen model's tokenizer, off the GUI thread."""
        if self.task and self.task.is_running():
            return
        config = self.state.config
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText("Checking…")
        set_role(self.status, "muted")
        self.check_button.setEnabled(False)
        self.task = Task(  # in the helper process: tokenizing never holds the window's interpreter lock
            in_helper(check),
            config.data,
            config.model,
            method=config.train.method,  # preference methods read pairs (KTO: labelled answers), as training does
            weights=(config.preference.desirable_weight, config.preference.undesirable_weight),
            on_result=self._checked,
            on_error=self._failed,
            on_progress=self._progress,
        )

    def _progress(self, value: Any) -> None:
        message, fraction = value
        self.status.setText(message)
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))

    def _checked(self, result: DataCheck) -> None:
        self.result = result
        self.progress.hide()
        self.check_button.setEnabled(True)
        report = result.report
        where = "" if result.model is not None else " (choose a model to count tokens)"
        held = f" and {result.eval_report.rows_read:,} evaluation rows" if result.eval_report else ""
        checked = f"Checked {report.rows_read:,} training rows{held}{where}."
        if result.problems:
            # the core's messages are whole clauses that name the file ("x.jsonl is empty (0 bytes)"): they follow a
            # colon, never a verb that wants an object ("Could not read x.jsonl is empty")
            count = len(result.problems)
            what = f"{count} data entries could not be read" if count > 1 else "A data entry could not be read"
            problems = "; ".join(p.rstrip(".") for p in result.problems)
            self.status.setText(f"{what}: {problems}. Fix the path or remove it from the list. {checked}")
            set_role(self.status, "error")
        else:
            self.status.setText(checked)
        self._show_report(result)
        self.checked.emit(result)
        if result.preview:
            self.preview_table.selectRow(0)

    def _failed(self, error: TaskError) -> None:
        self.progress.hide()
        self.check_button.setEnabled(True)
        self.status.setText(f"{error.message}" + (f" — {error.advice}" if error.advice else ""))
        set_role(self.status, "error")
        self.checked.emit(error)

    # ---- showing ----
    def _show_report(self, result: DataCheck | None) -> None:
        report = result.report if result else None
        if report is None:
            for tile in (self.kept_tile, self.skipped_tile, self.truncated_tile, self.tokens_tile, self.lengths_tile):
                tile.set("—", "")
            self.skipped_table.setRowCount(0)
            self._show_skipped_rows([])
            self.report_text.setHtml(f"<p style='color:{self._muted()}'>Press Check data to validate every row.</p>")
            self.preview_table.setRowCount(0)
            self.inspector.clear()
            self.pair_inspector.clear()
            self._draw_histogram(np.zeros(0))
            return
        reasons = dict(report.skipped)
        if result.eval_report:
            reasons.update(
                {f"{reason} (evaluation data)": count for reason, count in result.eval_report.skipped.items()}
            )
        skipped = sum(report.skipped.values())
        self.kept_tile.set(f"{report.rows_kept:,}", f"of {report.rows_read:,} read")
        top = max(report.skipped.items(), key=lambda kv: kv[1])[0] if report.skipped else "none skipped"
        self.skipped_tile.set(f"{skipped:,}", top)
        self.truncated_tile.set(f"{report.truncated:,}", f"longer than {self.state.config.data.max_length:,}")
        if result.lengths.size:
            share = report.trained_tokens / report.tokens if report.tokens else 0
            self.tokens_tile.set(f"{report.tokens:,}", f"{report.trained_tokens:,} trained ({share:.0%})")
            self.lengths_tile.set(
                f"{report.length_median:,}", f"median · p95 {report.length_p95:,} · max {report.length_max:,}"
            )
        else:
            detail, _why = self._no_lengths(result)
            self.tokens_tile.set("—", detail)
            self.lengths_tile.set("—", detail)
        self.skipped_table.setRowCount(len(reasons))
        for row, (reason, count) in enumerate(sorted(reasons.items(), key=lambda kv: -kv[1])):
            self.skipped_table.setItem(row, 0, QTableWidgetItem(reason))
            count_item = QTableWidgetItem(f"{count:,}")
            count_item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            self.skipped_table.setItem(row, 1, count_item)
        self.skipped_table.setVisible(bool(reasons))
        _fit_rows(self.skipped_table, len(reasons))  # every reason in view, none cut
        self._show_skipped_rows(skipped_rows(report, "train") + skipped_rows(result.eval_report, "eval"))
        self.report_text.setHtml(report_html(report, result.eval_report))
        self._show_preview(result.preview)
        self._draw_histogram(result.lengths, self._no_lengths(result)[1])

    def _show_preview(self, views: list[Any]) -> None:
        self.preview_table.setRowCount(len(views))
        for row, view in enumerate(views):
            prompt, response = row_lines(view) if is_preference_view(view) else prompt_and_response(view.messages or [])
            cells = [
                view.source.rpartition(":")[2],
                prompt,
                response,
                f"{view.num_tokens:,}",
                f"{view.num_trained:,}",
                "",
            ]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(text if col in (1, 2) else "")
                if col in (0, 3, 4):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.preview_table.setItem(row, col, item)
            if view.images:
                image_item = self.preview_table.item(row, 5)
                image_item.setText(f"{len(view.images)}")
                icon_ = thumbnail(view.images[0].source)
                if icon_ is not None:
                    image_item.setIcon(icon_)
                    self.preview_table.setRowHeight(row, THUMBNAIL + 8)
                image_item.setToolTip(
                    "\n".join(f"{im.source} ({im.width}×{im.height}, {im.tokens} tokens)" for im in view.images)
                )

    def _preview_selected(self) -> None:
        rows = self.preview_table.selectionModel().selectedRows()
        if not rows or not self.result or not self.result.preview:
            return
        self.show_view(self.result.preview[rows[0].row()])

    def _show_skipped_rows(self, rows: list[SkippedRow]) -> None:
        self.skipped = rows
        table = self.skipped_rows_table
        table.blockSignals(True)
        table.setRowCount(len(rows))
        for row, skipped in enumerate(rows):
            where = QTableWidgetItem(skipped.where + (" (evaluation)" if skipped.split == "eval" else ""))
            where.setToolTip(skipped.source)
            table.setItem(row, 0, where)
            why = QTableWidgetItem(skipped.why)
            why.setToolTip(skipped.why)
            table.setItem(row, 1, why)
        table.blockSignals(False)
        table.setVisible(bool(rows))
        _fit_rows(table, min(len(rows), SKIPPED_ROWS_SHOWN))

    def _skipped_selected(self) -> None:
        rows = self.skipped_rows_table.selectionModel().selectedRows()
        if rows:
            self.inspect_skipped(self.skipped[rows[0].row()])

    def inspect_skipped(self, skipped: SkippedRow) -> None:
        """Open a skipped row in the inspector: why it was skipped and the row as the file holds it."""
        entries = self.state.config.data.train if skipped.split == "train" else self.state.config.data.eval
        self.tabs.setCurrentIndex(self.tabs.indexOf(self.inspector.parentWidget()))
        self.inspector_title.setText(f"{skipped.where}: skipped — {skipped.why}")
        self.inspector.clear()
        self.inspect_row(entry_for(skipped.source, entries), skipped.row)
        self._inspecting = skipped

    def inspect_row(self, entry: str, row: int) -> None:
        """Show any row of a file in the inspector (skipped rows show why, and the row as the file holds it)."""
        if not self.result:
            return
        self._inspecting = None
        self.inspect_task = Task(
            in_helper(inspect),
            entry,
            row,
            self.state.config.data,
            self.result.model,
            self.result.method,
            on_result=self._inspected,
            on_error=self._inspect_failed,
        )

    def _inspected(self, result: tuple[Any, str]) -> None:
        view, raw = result
        self.show_view(view, raw)
        self.inspected.emit(result)

    def _inspect_failed(self, error: TaskError) -> None:
        self.inspector_title.setText(error.message)
        self.inspected.emit(error)

    def show_view(self, view: Any, raw: str = "") -> None:
        """Render a RowView: the chat-template text with the trained tokens highlighted; a skipped row (or, without
        a model, a row the view could not be made of) as the file holds it. A preference row's view (PreferenceView)
        shows in the pair inspector."""
        pairs = is_preference_view(view) and not view.problem
        self.inspector.setVisible(not pairs)
        self.pair_inspector.setVisible(pairs)
        if view is None or view.problem:
            skipped = self._inspecting
            where = view.source if view is not None else (skipped.where if skipped else "")
            why = view.problem if view is not None else (skipped.why if skipped else "")
            why = why.removeprefix(f"{where}: ")  # the problem names its row too; say it once
            self.inspector_title.setText(f"{Path(where).name}: skipped — {why}")
            self.inspector.setPlainText(raw or "(the row is empty)")
            self.legend.setText("The row as the file holds it: fix it there and check again.")
            return
        if pairs:
            self.inspector_title.setText(self.pair_inspector.show_view(view, self.palette_))
            self.legend.setText(
                "Highlighted text is what the method scores in each answer; the prompt is context only."
            )
            return
        share = view.num_trained / view.num_tokens if view.num_tokens else 0
        truncated = " · truncated" if view.truncated else ""
        self.inspector_title.setText(
            f"{view.source} · {view.format} · {view.num_tokens:,} tokens, "
            f"{view.num_trained:,} trained ({share:.0%}){truncated}"
        )
        self.inspector.setHtml(highlight_html(view.pieces, self.palette_))
        self.legend.setText("Highlighted text is what the model learns to write; the rest is context only.")

    def _draw_histogram(self, lengths: np.ndarray, why: str = "") -> None:
        colour = self.palette_.loss if self.palette_ else "#7567ff"
        self.lengths_chart.draw(lengths, self.state.config.data.max_length, colour, why)

    def _no_lengths(self, result: DataCheck) -> tuple[str, str]:
        """Why a check counted no tokens: (the tiles' detail, what the histogram says instead)."""
        if result.model is None:
            if self.state.config.model.name_or_path:  # chosen since this check: the next one counts
                return "press Check data", "Press Check data to count the tokens with the chosen model."
            return "choose a model", "Choose a model on the Model page to count tokens, then press Check data."
        return "no rows kept", "No row was kept, so there are no lengths to show: the report below says why."

    def _method_changed(self, config: Any) -> None:
        """Rows are read as the training method reads them: a check made for another kind of rows is made again."""
        if self.result is None or rows_kind(self.result.method) == rows_kind(config.train.method):
            return
        if self.task is not None and self.task.is_running():  # a check is under way: look again when it ends
            self.task.finished.connect(lambda: self._method_changed(self.state.config))
            return
        self.run_check()

    def _model_changed(self, _info: Any) -> None:
        """Tokens are counted with the model's tokenizer: data checked with another model (or none) is checked
        again with the one chosen now."""
        if self.task is not None and self.task.is_running():  # a check is under way: look again when it ends
            self.task.finished.connect(lambda: self._model_changed(None))
            return
        checked_with = self.result.model.name_or_path if self.result and self.result.model else ""
        if self.result is not None and checked_with != self.state.config.model.name_or_path:
            self.run_check()

    @property
    def histogram_bars(self) -> pg.BarGraphItem | None:
        """The token-length histogram's bars drawn now (None before a check)."""
        return self.lengths_chart.bars

    def _muted(self) -> str:
        return self.palette_.muted if self.palette_ else "#888"

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.lengths_chart.apply_palette(palette)
        self.demo_button.setIcon(icon("sparkle", palette.accent, 16))
        self.check_button.setIcon(icon("check", "#ffffff", 14))
        for split in ("train", "eval"):
            add, folder, remove = getattr(self, f"{split}_buttons")
            add.setIcon(icon("plus", palette.text, 14))
            folder.setIcon(icon("folder", palette.text, 14))
            remove.setIcon(icon("minus", palette.text, 14))
        if self.result and self.result.preview and self.preview_table.selectionModel().selectedRows():
            self._preview_selected()


def _display(entry: str) -> str:
    return entry.removeprefix("bundled:") if entry.startswith("bundled:") else entry


def _fit_rows(table: QTableWidget, rows: int) -> None:
    """Make `table` exactly as tall as its header and first `rows` rows (the rest scroll)."""
    height = table.horizontalHeader().sizeHint().height() + 2 * table.frameWidth()
    height += sum(table.rowHeight(row) for row in range(rows))
    table.setFixedHeight(height)


def _tab() -> tuple[QWidget, QVBoxLayout]:
    """A tab page and its column layout, a little space below the tab bar."""
    tab = QWidget()
    layout = QVBoxLayout(tab)
    layout.setContentsMargins(0, 10, 0, 0)
    return tab, layout

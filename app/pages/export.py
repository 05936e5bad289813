"""Export page: write a run's adapter, merged model or GGUF — whichever formats core offers — with progress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from hone.app.pages.base import Page
from hone.app.theme import Palette, icon
from hone.app.threads import Task, TaskError
from hone.app.widgets.common import Card, label, set_role


def export_formats() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(format -> description, format -> {type -> description}) as core offers them now."""
    from hone.core.export import FORMAT_TYPES, SUPPORTED_FORMATS

    return dict(SUPPORTED_FORMATS), {name: dict(types) for name, types in FORMAT_TYPES.items()}


def default_out(run_dir: str, fmt: str) -> str:
    """Where core writes an export when no folder is given: RUN_DIR/exports/<format>[-type]."""
    from hone.core.export import parse_format

    return str(Path(run_dir) / "exports" / parse_format(fmt).folder_name)


def run_export(run_dir: str, fmt: str, out: str, force: bool, progress) -> Any:
    """Export on a worker thread; core's progress(stage, fraction) reports come back to the page."""
    from hone.core.export import export_run

    return export_run(run_dir, fmt, out or None, force=force, progress=lambda stage, fraction: progress(
        (stage, fraction)))


class ExportPage(Page):
    name = "export"
    title = "Export"
    subtitle = "Turn a run into files you can share or serve. Each export is read back and checked."
    icon_name = "export"

    exported = Signal(object)  # ExportResult or TaskError

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.task: Task | None = None
        self.result: Any = None

        source = Card("Run", "The run whose adapter to export.")
        row = QHBoxLayout()
        self.run_box = QComboBox()
        self.run_box.setEditable(True)
        self.run_box.currentTextChanged.connect(self._run_changed)
        row.addWidget(self.run_box, 1)
        self.run_button = QPushButton("Folder…")
        self.run_button.clicked.connect(self._pick_run)
        row.addWidget(self.run_button)
        source.body.addLayout(row)
        self.body.addWidget(source)

        formats = Card("Format")
        self.format_group = QButtonGroup(self)
        self.format_buttons: dict[str, QRadioButton] = {}
        self.formats_layout = QVBoxLayout()
        self.formats_layout.setSpacing(8)
        formats.body.addLayout(self.formats_layout)
        self.formats_note = label("", "muted", wrap=True)
        formats.body.addWidget(self.formats_note)
        self.body.addWidget(formats)

        target = Card("Destination")
        out_row = QHBoxLayout()
        self.out_edit = QLineEdit()
        self.out_edit.setPlaceholderText("RUN_DIR/exports/FORMAT")
        out_row.addWidget(self.out_edit, 1)
        self.out_button = QPushButton("Choose…")
        self.out_button.clicked.connect(self._pick_out)
        out_row.addWidget(self.out_button)
        target.body.addLayout(out_row)
        self.force_box = QCheckBox("Replace an earlier export in that folder")
        target.body.addWidget(self.force_box)
        buttons = QHBoxLayout()
        self.export_button = set_role(QPushButton("Export"), "primary")
        self.export_button.clicked.connect(self.export)
        self.open_button = QPushButton("Open folder")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self._open_out)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.open_button)
        buttons.addStretch(1)
        target.body.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.status = label("", "muted", wrap=True, selectable=True)
        target.body.addWidget(self.progress)
        target.body.addWidget(self.status)
        self.body.addWidget(target)
        self.body.addStretch(1)

        self._load_formats()
        state.session.running_changed.connect(lambda running: None if running else self.refresh_runs())
        self.refresh_runs()

    # ---- choices ----
    def _load_formats(self) -> None:
        try:
            formats, self.format_types = export_formats()
        except ImportError:
            formats, self.format_types = {}, {}
        for fmt, description in formats.items():
            button = QRadioButton(fmt)
            button.setToolTip(description)
            self.format_group.addButton(button)
            self.format_buttons[fmt] = button
            row = QHBoxLayout()
            row.addWidget(button)
            hint = label(description[0].upper() + description[1:] + ".", "muted", wrap=True)
            row.addWidget(hint, 1)
            self.formats_layout.addLayout(row)
            button.toggled.connect(self._format_changed)
        type_row = QHBoxLayout()
        self.type_label = label("Type")
        self.type_box = QComboBox()
        self.type_box.setMinimumWidth(320)
        self.type_box.currentIndexChanged.connect(self._suggest_out)
        type_row.addWidget(self.type_label)
        type_row.addWidget(self.type_box)
        type_row.addStretch(1)
        self.formats_layout.addLayout(type_row)
        if formats:
            self.format_buttons[next(iter(formats))].setChecked(True)
        else:
            self.formats_note.setText("This installation of Hone has no exporter (hone.core.export is missing).")
        self._format_changed()

    def _format_changed(self, *_: Any) -> None:
        types = self.format_types.get(self.selected_format(), {})
        self.type_box.blockSignals(True)
        self.type_box.clear()
        for name, description in types.items():
            self.type_box.addItem(f"{name} — {description}", name)
        self.type_box.blockSignals(False)
        self.type_box.setVisible(bool(types))
        self.type_label.setVisible(bool(types))
        self._suggest_out()
        self._update_buttons()

    def selected_format(self) -> str:
        """The format with its type, as export_run takes it (e.g. "gguf:q8_0")."""
        for fmt, button in self.format_buttons.items():
            if button.isChecked():
                kind = self.type_box.currentData() if self.format_types.get(fmt) else None
                return f"{fmt}:{kind}" if kind else fmt
        return ""

    def select_format(self, fmt: str) -> None:
        name, _, kind = fmt.partition(":")
        self.format_buttons[name].setChecked(True)
        if kind:
            self.type_box.setCurrentIndex(self.type_box.findData(kind))

    def refresh_runs(self) -> None:
        from hone.core.train.run_dir import list_runs

        runs_dir = Path(self.state.config.output.runs_dir)
        current = self.run_box.currentText()
        self.run_box.blockSignals(True)
        self.run_box.clear()
        if runs_dir.is_dir():
            for summary in list_runs(runs_dir):
                if summary.has_adapter:
                    self.run_box.addItem(Path(summary.run_dir).name, str(summary.run_dir))
        self.run_box.blockSignals(False)
        if current:
            self.set_run(current)
        elif self.run_box.count():
            self.set_run(self.run_box.itemData(0))
        self._update_buttons()

    def set_run(self, run_dir: str) -> None:
        index = self.run_box.findData(str(run_dir))
        if index >= 0:
            self.run_box.setCurrentIndex(index)
        else:
            self.run_box.setEditText(str(run_dir))
        self._suggest_out()

    def run_dir(self) -> str:
        data = self.run_box.currentData()
        text = self.run_box.currentText().strip()
        return str(data) if data and Path(str(data)).name == text else text

    def _run_changed(self, _text: str) -> None:
        self._suggest_out()
        self._update_buttons()

    def _suggest_out(self, *_: Any) -> None:
        run_dir, fmt = self.run_dir(), self.selected_format()
        if run_dir and fmt:
            self.out_edit.setText(default_out(run_dir, fmt))

    # ---- exporting ----
    def export(self) -> None:
        run_dir, fmt, out = self.run_dir(), self.selected_format(), self.out_edit.text().strip()
        if not (run_dir and fmt and out) or (self.task and self.task.is_running()):
            return
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText(f"Exporting {Path(run_dir).name} as {fmt}…")
        set_role(self.status, "muted")
        self.export_button.setEnabled(False)
        self.open_button.setEnabled(False)
        self.task = Task(run_export, run_dir, fmt, out, self.force_box.isChecked(),
                         on_result=self._done, on_error=self._failed, on_progress=self._progress)

    def _progress(self, value: tuple[str, float]) -> None:
        stage, fraction = value
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.status.setText(stage[0].upper() + stage[1:] if stage else "")

    def _done(self, result: Any) -> None:
        self.result = result
        self.progress.setValue(1000)
        count = len(result.files)
        lines = [f"Wrote {count} file{'s' if count != 1 else ''} to {result.path}"]
        numbers = [f"{name} {value:.3g}" if isinstance(value, float) else f"{name} {value}"
                   for name, value in result.checks.items() if not name.endswith(".tolerance")]
        if numbers:
            lines.append("Checks: " + ", ".join(numbers))
        lines += [f"Check failed: {failure}" for failure in result.failures]
        self.status.setText("\n".join(lines))
        set_role(self.status, "ok" if result.passed else "error")
        self.out_edit.setText(str(result.path))
        self.open_button.setEnabled(True)
        self._update_buttons()
        self.exported.emit(result)

    def _failed(self, error: TaskError) -> None:
        self.progress.hide()
        self.status.setText(f"Export failed: {error.message}" + (f"\n{error.advice}" if error.advice else ""))
        set_role(self.status, "error")
        self._update_buttons()
        self.exported.emit(error)

    def _update_buttons(self) -> None:
        busy = bool(self.task and self.task.is_running())
        self.export_button.setEnabled(bool(self.run_dir() and self.selected_format()) and not busy)

    def _pick_run(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Run folder", self.state.config.output.runs_dir)
        if folder:
            self.set_run(folder)

    def _pick_out(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export to")
        if folder:
            self.out_edit.setText(folder)

    def _open_out(self) -> None:
        QDesktopServices.openUrl(QUrl.fromLocalFile(self.out_edit.text()))

    def shown(self) -> None:
        self.refresh_runs()

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.export_button.setIcon(icon("export", "#ffffff", 14))
        for button in (self.run_button, self.out_button, self.open_button):
            button.setIcon(icon("folder", palette.text, 16))

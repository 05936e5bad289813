"""Export page: write a run's adapter, merged model or GGUF — whichever formats core offers — with progress, then
push it to the Hugging Face Hub."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
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

from hone.app.helper_process import in_helper
from hone.app.jobs import run_export
from hone.app.pages.base import Page
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, human_bytes, label, set_role
from hone.app.workers import Task, TaskError

# What the page says while no run is chosen (no run trained yet, or none picked).
EMPTY_RUN = "Train a run or pick one under Runs to export it (or choose its folder with Folder…)."


def _without_specs(description: str) -> str:
    """A format's description without the command line's spellings in brackets ("(gguf:TYPE, default q8_0)"):
    the page offers the types in its own box; the tooltip keeps the whole description."""
    return re.sub(r"\s*\([^()]*\b(?:gguf|ollama|merged):[^()]*\)", "", description)


def export_formats() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """(format -> description, format -> {type -> description}) as core offers them now."""
    from hone.core.api import FORMAT_TYPES, SUPPORTED_FORMATS

    return dict(SUPPORTED_FORMATS), {name: dict(types) for name, types in FORMAT_TYPES.items()}


def default_out(run_dir: str, fmt: str) -> str:
    """Where core writes an export when no folder is given: RUN_DIR/exports/<format>[-type]."""
    from hone.core.api import parse_format

    return str(Path(run_dir) / "exports" / parse_format(fmt).folder_name)


def run_push(folder: str, repo_id: str, private: bool, progress) -> Any:
    """Push an export on a worker thread (hone.core.hub.push); PushProgress reports come back to the page."""
    from hone.core.api import push_folder

    return push_folder(folder, repo_id, private=private, progress=progress)


def default_type(fmt: str) -> str:
    """The type `fmt` exports with when none is named (hone.core.export.formats), "" for the first in its list."""
    from hone.core.api import DEFAULT_TYPES

    return DEFAULT_TYPES.get(fmt, "")


def is_export(folder: str) -> bool:
    """`folder` holds an export Hone wrote (its export.json)."""
    from hone.core.api import MANIFEST_FILE

    return bool(folder) and (Path(folder) / MANIFEST_FILE).is_file()


@dataclass(frozen=True)
class CheckRow:
    """One read-back check as the page shows it: passed or not, what was checked, and the number if any."""

    passed: bool
    what: str
    detail: str = ""


def check_rows(checks: dict[str, float | str], failures: list[str]) -> list[CheckRow]:
    """The verdicts among an export's checks, one row each; plain notes (numbers without a tolerance) are left out.

    A compared number is recorded just before its tolerance (`CheckLog.within`), so each ".tolerance" entry
    closes the number before it; yes/no checks are "ok" or "FAILED: why".
    """
    rows, previous = [], None
    failed_names = {f.rsplit("(", 1)[-1].rstrip(")") for f in failures if f.endswith(")")}
    for name, value in checks.items():
        if name.endswith(".tolerance") and previous is not None and isinstance(value, float):
            compared, number = previous
            ok = compared not in failed_names and number <= value
            rows.append(
                CheckRow(
                    ok,
                    _check_name(compared.rsplit(".", 1)[0]),
                    f"{_words(compared.rsplit('.', 1)[-1])} {number:.3g} {'≤' if ok else '>'} tolerance {value:.3g}",
                )
            )
        elif isinstance(value, str) and value == "ok":
            rows.append(CheckRow(True, _check_name(name)))
        elif isinstance(value, str) and value.startswith("FAILED"):
            rows.append(CheckRow(False, _check_name(name), value.partition(":")[2].strip()))
        previous = (name, value) if isinstance(value, float) else None
    return rows


def next_step(fmt: str, path: Path, files: list[Path]) -> str:
    """The command (or code) that uses what an export wrote."""
    name = fmt.partition(":")[0]
    ggufs = [f for f in files if f.suffix == ".gguf"]
    if name == "ollama":
        modelfile = path / "Modelfile"
        # the Modelfile's own comment names the model after the run: "# Create the model: ollama create NAME -f ..."
        text = modelfile.read_text(encoding="utf-8") if modelfile.is_file() else ""
        found = re.search(r"ollama create (\S+) -f", text)
        model = found.group(1) if found else "my-model"
        return f'ollama create {model} -f "{modelfile}"  then  ollama run {model}'
    if name == "gguf" and ggufs:
        return f'llama-cli -m "{ggufs[0]}"  (or load the file in LM Studio)'
    if name == "gguf-lora" and ggufs:
        return f'llama-cli -m BASE_MODEL.gguf --lora "{ggufs[0]}"'
    if name == "merged":
        return f'AutoModelForCausalLM.from_pretrained(r"{path}")  (transformers)'
    return f'PeftModel.from_pretrained(base_model, r"{path}")  (peft)'


def result_html(result: Any) -> str:
    """An export's outcome for the page: verdict, each check passed or failed, the files with sizes, what next."""
    rows = check_rows(result.checks, result.failures)
    passed = sum(row.passed for row in rows)
    head = (
        f"<b>Export checked: {passed} of {len(rows)} checks passed.</b>"
        if result.passed
        else f"<b>Export written, but {len(rows) - passed} of {len(rows)} checks failed.</b>"
    )
    lines = [head]
    lines += [
        f"{'✓' if row.passed else '✗'} {escape(row.what)}" + (f": {escape(row.detail)}" if row.detail else "")
        for row in rows
    ]
    if all(row.passed for row in rows):  # a failure no check row carries: say it as core wrote it
        lines += [f"✗ {escape(failure)}" for failure in result.failures]
    sizes = [f"{escape(f.name)} ({human_bytes(f.stat().st_size)})" for f in result.files if f.is_file()]
    lines.append(f"<br>Files in {escape(str(result.path))}: {', '.join(sizes)}")
    if result.passed:
        command = next_step(result.format, Path(result.path), result.files)
        lines.append(f"Next: <code>{escape(command, quote=False)}</code>")
    return "<br>".join(lines)


def _check_name(stem: str) -> str:
    return " › ".join(_words(part) for part in stem.split("."))


def _words(part: str) -> str:
    # quantization type names (q4_0, f16, bf16) keep their underscore; other names read as words
    return part if re.fullmatch(r"[a-z]*\d+(_\d+)?", part) else part.replace("_", " ")


class ExportPage(Page):
    name = "export"
    title = "Export"
    subtitle = "Turn a run into files you can share or serve. Each export is read back and checked."
    icon_name = "export"

    exported = Signal(object)  # ExportResult or TaskError
    pushed = Signal(object)  # PushResult or TaskError

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.task: Task | None = None
        self.push_task: Task | None = None
        self.push_dialog = None
        self.result: Any = None

        source = Card("Run", "The run whose adapter to export.")
        row = QHBoxLayout()
        self.run_box = QComboBox()
        self.run_box.setEditable(True)
        self.run_box.lineEdit().setPlaceholderText("A run's folder")
        self.run_box.currentTextChanged.connect(self._run_changed)
        row.addWidget(self.run_box, 1)
        self.run_button = QPushButton("Folder…")
        self.run_button.clicked.connect(self._pick_run)
        row.addWidget(self.run_button)
        source.body.addLayout(row)
        self.run_hint = label(EMPTY_RUN, "muted", wrap=True)
        source.body.addWidget(self.run_hint)
        # the final adapter, the best checkpoint by each stored score, or any saved checkpoint
        self.weights_box = QComboBox()
        self.weights_box.setAccessibleName("Weights to export")
        self.weights_box.setToolTip(
            "Which adapter to export: the run's final one, or a saved checkpoint's, the best by a score that "
            "hone eval --checkpoints all (or train.eval_checkpoints) stored, or any step. A checkpoint's model card "
            "names its step and its scores."
        )
        self.weights_box.currentIndexChanged.connect(lambda _index: self._suggest_out())
        source.body.addWidget(self.weights_box)
        self.weights_note = label("", "muted", wrap=True)
        source.body.addWidget(self.weights_note)
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
        self.out_edit.setPlaceholderText("Empty: the run's exports folder, one subfolder per format")
        self.out_edit.setAccessibleName("Export folder")
        self.out_edit.textChanged.connect(self._update_buttons)
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
        self.push_button = QPushButton("Push to the Hub…")
        self.push_button.setToolTip(
            "Upload the export in that folder, with its model card, to a model repository on the Hugging Face Hub."
        )
        self.push_button.clicked.connect(self.open_push)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.push_button)
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
            shown = _without_specs(description)
            hint = label(shown[0].upper() + shown[1:] + ".", "muted", wrap=True)
            row.addWidget(hint, 1)
            self.formats_layout.addLayout(row)
            # toggled fires for the button turned off and the one turned on: refill the types once, for the latter
            button.toggled.connect(lambda checked: self._format_changed() if checked else None)
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

    def _format_changed(self) -> None:
        types = self.format_types.get(self.checked_format(), {})
        self.type_box.blockSignals(True)
        self.type_box.clear()
        for name, description in types.items():
            self.type_box.addItem(f"{name} — {description}", name)
        if types:  # the format's own default type (GGUF: q8_0), not the first in the list (f32)
            self.type_box.setCurrentIndex(max(0, self.type_box.findData(default_type(self.checked_format()))))
        self.type_box.blockSignals(False)
        self.type_box.setVisible(bool(types))
        self.type_label.setVisible(bool(types))
        self._suggest_out()
        self._update_buttons()

    def checked_format(self) -> str:
        """The format whose button is checked, without a type ("gguf"); "" when none is."""
        return next((fmt for fmt, button in self.format_buttons.items() if button.isChecked()), "")

    def selected_format(self) -> str:
        """The format with its type, as export_run takes it (e.g. "gguf:q8_0")."""
        fmt = self.checked_format()
        kind = self.type_box.currentData() if self.format_types.get(fmt) else None
        return f"{fmt}:{kind}" if kind else fmt

    def select_format(self, fmt: str) -> None:
        name, _, kind = fmt.partition(":")
        self.format_buttons[name].setChecked(True)
        if kind:
            self.type_box.setCurrentIndex(self.type_box.findData(kind))

    def refresh_runs(self) -> None:
        from hone.core.api import list_runs

        runs_dir = Path(self.state.config.output.runs_dir)
        current = self.run_dir()  # the folder, not the name shown: a name alone would be read from the working folder
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
        self._load_weights()  # the same run chosen again may have new checkpoints or scores since
        self._suggest_out()

    def offer_run(self, run_dir: str) -> None:
        """A run just ended with an adapter (or the Monitor's Export asks for it): make it the chosen run, unless an
        export or a push is under way (its run stays chosen)."""
        if self.is_busy():
            return
        self.refresh_runs()
        self.set_run(run_dir)
        self._update_buttons()

    def run_dir(self) -> str:
        data = self.run_box.currentData()
        text = self.run_box.currentText().strip()
        return str(data) if data and Path(str(data)).name == text else text

    def _run_changed(self, _text: str) -> None:
        self._load_weights()
        self._suggest_out()
        self._update_buttons()

    def _load_weights(self) -> None:
        """The chosen run's weights to export (scores.json and the checkpoints' manifests: small files, no weights);
        the list shows only when the run has saved checkpoints. The same choice stays chosen where it still is."""
        from hone.core.api import weights_choices

        before = self.weights()
        run_dir = self.run_dir()
        choices, note = weights_choices(run_dir) if run_dir and Path(run_dir).is_dir() else ([], "")
        self.weights_box.blockSignals(True)
        self.weights_box.clear()
        for choice in choices:
            self.weights_box.addItem(choice.label, choice)
        keep = next(
            (i for i, c in enumerate(choices) if before and (c.checkpoint, c.by) == (before.checkpoint, before.by)), 0
        )
        self.weights_box.setCurrentIndex(keep)
        self.weights_box.blockSignals(False)
        self.weights_box.setVisible(len(choices) > 1)
        self.weights_note.setText(note)
        self.weights_note.setVisible(len(choices) > 1 and bool(note))

    def weights(self) -> Any:
        """The chosen WeightsChoice (None before a run is chosen): its `checkpoint` is None for the final adapter."""
        return self.weights_box.currentData()

    def select_weights(self, *, best_by: str | None = None, step: int | None = None) -> bool:
        """Choose the best checkpoint by `best_by`, or the checkpoint of `step`; False when the list has none."""
        for i in range(self.weights_box.count()):
            choice = self.weights_box.itemData(i)
            if (best_by is not None and choice.by == best_by) or (
                step is not None and choice.by is None and choice.checkpoint == step
            ):
                self.weights_box.setCurrentIndex(i)
                return True
        return False

    def _suggest_out(self, *_: Any) -> None:
        run_dir, fmt = self.run_dir(), self.selected_format()
        if run_dir and fmt:
            chosen = self.weights()
            step = f"-step-{chosen.checkpoint}" if chosen is not None and chosen.checkpoint is not None else ""
            self.out_edit.setText(default_out(run_dir, fmt) + step)

    # ---- exporting ----
    def export(self) -> None:
        run_dir, fmt, out = self.run_dir(), self.selected_format(), self.out_edit.text().strip()
        if not (run_dir and fmt and out) or self.is_busy():
            return
        chosen = self.weights()
        step = chosen.checkpoint if chosen is not None else None
        self.progress.setValue(0)
        self.progress.show()
        which = f" (its checkpoint of step {step})" if step is not None else ""
        self.status.setText(f"Exporting {Path(run_dir).name}{which} as {fmt}…")
        set_role(self.status, "muted")
        self.export_button.setEnabled(False)
        self.open_button.setEnabled(False)
        self.push_button.setEnabled(False)
        self.task = Task(
            in_helper(run_export),  # in the helper process: an export's work never stalls the window
            run_dir,
            fmt,
            out,
            self.force_box.isChecked(),
            checkpoint=step,
            scores=chosen.scores if chosen is not None else None,
            on_result=self._done,
            on_error=self._failed,
            on_progress=self._progress,
        )
        self.task.finished.connect(self._update_buttons)  # the task counts as running until its thread ends

    def _progress(self, value: tuple[str, float]) -> None:
        stage, fraction = value
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.status.setText(stage[0].upper() + stage[1:] if stage else "")

    def _done(self, result: Any) -> None:
        self.result = result
        self.progress.setValue(1000)
        self.status.setText(result_html(result))
        self.status.setToolTip(
            "Every number the read-back recorded:\n"
            + "\n".join(
                f"{name} = {value:.4g}" if isinstance(value, float) else f"{name} = {value}"
                for name, value in result.checks.items()
            )
        )
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

    # ---- pushing ----
    def open_push(self):
        """The Push to the Hub dialog for the export in the destination folder (a PushDialog), or None when that
        folder holds no export yet."""
        from hone.app.widgets.push_dialog import PushDialog

        folder = self.out_edit.text().strip()
        if not is_export(folder) or self.is_busy():
            return None
        name = f"{Path(self.run_dir()).name}-{Path(folder).name}" if self.run_dir() else Path(folder).name
        self.push_dialog = PushDialog(folder, name, self)
        self.push_dialog.push_asked.connect(lambda repo_id, private: self.push(folder, repo_id, private))
        self.push_dialog.open()
        return self.push_dialog

    def push(self, folder: str, repo_id: str, private: bool) -> None:
        if self.is_busy():
            return
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText(f"Pushing {folder} to {repo_id} on the Hugging Face Hub…")
        set_role(self.status, "muted")
        self.push_task = Task(
            run_push,
            folder,
            repo_id,
            private,
            on_result=self._pushed,
            on_error=self._push_failed,
            on_progress=self._push_progress,
        )
        self.push_task.finished.connect(self._update_buttons)
        self._update_buttons()

    def _push_progress(self, p: Any) -> None:
        self.progress.setValue(int(1000 * p.fraction))
        self.status.setText(f"{p.stage[0].upper()}{p.stage[1:]} ({human_bytes(p.done)} of {human_bytes(p.total)})")

    def _pushed(self, result: Any) -> None:
        self.progress.setValue(1000)
        card = " Hone wrote its model card (README.md) into the folder first." if result.card_written else ""
        self.status.setText(
            f"Pushed {len(result.files)} files ({human_bytes(result.total_bytes)}) to "
            f"{result.url} in commit {result.commit[:12]}.{card}"
        )
        set_role(self.status, "ok")
        self._update_buttons()
        self.pushed.emit(result)

    def _push_failed(self, error: TaskError) -> None:
        self.progress.hide()
        self.status.setText(f"Push failed: {error.message}" + (f"\n{error.advice}" if error.advice else ""))
        set_role(self.status, "error")
        self._update_buttons()
        self.pushed.emit(error)

    def is_busy(self) -> bool:
        return any(task is not None and task.is_running() for task in (self.task, self.push_task))

    def _update_buttons(self) -> None:
        busy = self.is_busy()
        self.run_hint.setVisible(not self.run_dir())
        self.export_button.setEnabled(bool(self.run_dir() and self.selected_format()) and not busy)
        self.export_button.setToolTip("" if self.run_dir() else EMPTY_RUN)
        self.push_button.setEnabled(is_export(self.out_edit.text().strip()) and not busy)

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

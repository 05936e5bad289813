"""Chat page: the base model and the fine-tuned model answer side by side, streaming, off the GUI thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from hone.app.pages.base import Page
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, label, set_role
from hone.app.widgets.config_form import FloatSpinBox
from hone.app.workers import describe_exception
from hone.core.api import BASE, TUNED


class ChatEngine(QObject):
    """Lives on the chat thread: loads the models once, then streams replies. Every slot reports back by signal."""

    loaded = Signal(object)  # (description, has_adapter)
    piece = Signal(object)  # (side, text)
    reply_done = Signal()
    failed = Signal(object)  # TaskError
    eval_progress = Signal(object)  # (prompts done, prompts in all)
    evaluated = Signal(object)  # (hone.core.inference.evaluate.Comparison, rows skipped) or None after a failure

    def __init__(self):
        super().__init__()
        self.models = None

    @Slot(object)
    def load(self, source: dict[str, Any]) -> None:
        try:
            from hone.core.api import ChatModels

            self.models = None
            if source.get("run_dir"):
                self.models = ChatModels.for_run(source["run_dir"])
                text = f"{Path(source['run_dir']).name}: base model and its adapter"
            else:
                self.models = ChatModels.load(source["model"], source.get("adapter"))
                text = f"{source['model']}" + (" with adapter" if source.get("adapter") else " (base only)")
            self.loaded.emit((text, self.models.has_adapter))
        except Exception as e:
            self.failed.emit(describe_exception(e))

    @Slot(object)
    def generate(self, request: dict[str, Any]) -> None:
        try:
            from hone.core.api import GenerationSettings

            settings = GenerationSettings(**request["settings"])
            stream = self.models.stream_both(
                request["base"], settings, request["stop"], tuned_messages=request["tuned"]
            )
            for side, text in stream:
                self.piece.emit((side, text))
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.reply_done.emit()

    @Slot(object)
    def evaluate(self, request: dict[str, Any]) -> None:
        """Answer the held-out rows of request["path"] (the first request["rows"]) with both models and score them;
        for a preference run (request["config"]), rank its held-out pairs with both instead."""
        if request.get("config") is not None:
            self._rank_pairs(request)
            return
        result = None
        try:
            from hone.core.api import compare, read_prompts, with_references

            prompts, skipped = read_prompts(Path(request["path"]))
            prompts = with_references(prompts, request["rows"] or None)
            comparison = compare(
                self.models,
                prompts,
                stop=request["stop"],
                progress=lambda done, total: self.eval_progress.emit((done, total)),
            )
            result = (comparison, skipped)
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.evaluated.emit(result)

    def _rank_pairs(self, request: dict[str, Any]) -> None:
        result = None
        try:
            from hone.core.api import held_out_pairs, score_pairs

            pairs = held_out_pairs(request["config"], self.models.tokenizer, request.get("path"))
            result = score_pairs(
                self.models,
                pairs,
                limit=request["rows"] or None,
                progress=lambda done, total: self.eval_progress.emit((done, total)),
            )
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.evaluated.emit(result)


def preference_summary(scores) -> str:
    """One line for a preference evaluation: how often each model ranks the chosen answer first."""
    return (
        f"the fine-tune ranks the chosen answer first in {scores.tuned_right} of {scores.pairs} held-out pairs "
        f"({scores.accuracy(True):.0%}), the base in {scores.base_right} ({scores.accuracy(False):.0%})"
    )


class PreferenceDialog(QDialog):
    """A preference run's evaluation: per model, how often it ranks each held-out pair's chosen answer above the
    rejected one, and by how much; with the fine-tune's implicit reward (its gain over the base, chosen against
    rejected)."""

    ROWS = ("Preference accuracy", "Mean margin (log-prob per token)")

    def __init__(self, title: str, scores, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        layout = QVBoxLayout(self)
        summary = preference_summary(scores)
        self.summary = label(summary[0].upper() + summary[1:] + ".", wrap=True, selectable=True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(len(self.ROWS) + 1, 2)
        self.table.setHorizontalHeaderLabels(("Base", "Fine-tuned"))
        self.table.setVerticalHeaderLabels((*self.ROWS, "Reward ranks chosen first"))
        cells = (
            (f"{scores.accuracy(False):.1%}", f"{scores.accuracy(True):.1%}"),
            (f"{scores.base_margin:+.3f}", f"{scores.tuned_margin:+.3f}"),
            ("—", f"{scores.reward_right / max(scores.pairs, 1):.1%}"),
        )
        for r, row in enumerate(cells):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                item.setFlags(item.flags() & ~Qt.ItemIsEditable)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        layout.addWidget(self.table, 1)


class EvaluationDialog(QDialog):
    """The scores of an evaluation and every prompt's answers, base beside fine-tune (✓ = the reference exactly)."""

    COLUMNS = ("Row", "Question", "Reference", "Base", "Fine-tuned")

    def __init__(self, title: str, comparison, skipped: list[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.resize(1100, 560)
        layout = QVBoxLayout(self)
        summary = comparison.summary() + (f"; {len(skipped)} rows of the file could not be read" if skipped else "")
        self.summary = label(summary[0].upper() + summary[1:] + ".", wrap=True, selectable=True)
        layout.addWidget(self.summary)
        self.table = QTableWidget(len(comparison.answered), len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(self.COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(True)
        for r, answered in enumerate(comparison.answered):
            cells = (
                str(answered.row),
                answered.question,
                answered.reference,
                _scored(answered.base, answered.exact(BASE), answered.f1(BASE)),
                _scored(answered.tuned, answered.exact(TUNED), answered.f1(TUNED)),
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setFlags(item.flags() & ~Qt.ItemIsEditable)
                self.table.setItem(r, c, item)
        self.table.resizeColumnToContents(0)
        for c in range(1, len(self.COLUMNS)):
            self.table.setColumnWidth(c, 250)
        self.table.resizeRowsToContents()
        layout.addWidget(self.table, 1)


def _scored(answer: str, exact: bool, f1: float) -> str:
    return f"{'✓' if exact else '✗'} F1 {f1:.2f}\n{answer}"


class Transcript(QTextBrowser):
    """One side's conversation; replies grow token by token at the end."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setMinimumHeight(320)
        self.accent = "#7567ff"

    def add_user(self, text: str) -> None:
        cursor = self._end()
        if not self.document().isEmpty():
            cursor.insertBlock()
        cursor.insertHtml(f"<p style='margin-top:10px'><b style='color:{self.accent}'>You</b></p>")
        cursor.insertBlock()
        cursor.insertText(text, QTextCharFormat())
        cursor.insertBlock()
        cursor.insertHtml("<p style='margin-top:8px'><b>Assistant</b></p>")
        cursor.insertBlock()
        self.ensureCursorVisible()

    def add_piece(self, text: str) -> None:
        # a plain format, not the cursor's: the cursor carries the bold of the heading inserted just before
        self._end().insertText(text, QTextCharFormat())
        self.ensureCursorVisible()

    def _end(self) -> QTextCursor:
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.End)
        self.setTextCursor(cursor)
        return cursor


class ChatPage(Page):
    name = "chat"
    title = "Chat"
    subtitle = "Ask both models the same question and compare: the base on the left, your fine-tune on the right."
    icon_name = "chat"
    scrollable = False

    _load_requested = Signal(object)
    _generate_requested = Signal(object)
    _evaluate_requested = Signal(object)
    reply_finished = Signal()
    evaluation_finished = Signal()

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.thread: QThread | None = None
        self.engine: ChatEngine | None = None
        self.loaded = False
        self.has_adapter = False
        self.generating = False
        self.stop_flag = threading.Event()
        self.history = {BASE: [], TUNED: []}
        self.replies = {BASE: "", TUNED: ""}

        source = Card()
        row = QHBoxLayout()
        row.addWidget(label("Fine-tuned run"))
        self.run_box = QComboBox()
        self.run_box.setMinimumWidth(320)
        row.addWidget(self.run_box, 1)
        self.load_button = set_role(QPushButton("Load models"), "primary")
        self.load_button.clicked.connect(self.load_selected)
        row.addWidget(self.load_button)
        self.evaluate_button = QPushButton("Evaluate…")
        self.evaluate_button.setToolTip(
            "Answer held-out rows (the run's evaluation file, or one you choose) with "
            "both models and score them against the rows' references."
        )
        self.evaluate_button.clicked.connect(lambda: self.evaluate())
        row.addWidget(self.evaluate_button)
        self.evaluation_dialog: EvaluationDialog | None = None
        self.source: dict[str, Any] = {}
        source.body.addLayout(row)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # loading weights reports no progress of its own
        self.busy.setMaximumHeight(6)
        self.busy.hide()
        self.status = label("Choose a run and load it; the base model comes from the run's config.", "muted", wrap=True)
        source.body.addWidget(self.busy)
        source.body.addWidget(self.status)
        self.body.addWidget(source)

        panes = QHBoxLayout()
        panes.setSpacing(12)
        self.transcripts: dict[str, Transcript] = {}
        for side, title in ((BASE, "Base model"), (TUNED, "Fine-tuned")):
            card = Card(title)
            transcript = Transcript()
            card.body.addWidget(transcript)
            self.transcripts[side] = transcript
            panes.addWidget(card, 1)
        self.body.addLayout(panes, 1)

        compose = Card()
        prompt_row = QHBoxLayout()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Ask something… (Ctrl+Enter sends)")
        self.prompt.setFixedHeight(64)
        prompt_row.addWidget(self.prompt, 1)
        self.send_button = set_role(QPushButton("Send"), "primary")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop_flag.set)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.clear)
        for button in (self.send_button, self.stop_button, self.clear_button):
            prompt_row.addWidget(button, 0, Qt.AlignTop)
        compose.body.addLayout(prompt_row)
        knobs = QHBoxLayout()
        knobs.addWidget(label("Max new tokens", "muted"))
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 8192)
        self.max_tokens.setValue(256)
        knobs.addWidget(self.max_tokens)
        knobs.addSpacing(16)
        knobs.addWidget(label("Temperature", "muted"))
        self.temperature = FloatSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setValue(0.0)
        self.temperature.setToolTip("0 = greedy: the most likely token each time, the same reply every time.")
        knobs.addWidget(self.temperature)
        knobs.addStretch(1)
        self.generating_label = label("Generating…", "muted")
        self.generating_label.setToolTip("The reply is being written; Stop ends it where it is.")
        knobs.addWidget(self.generating_label)
        compose.body.addLayout(knobs)
        self.body.addWidget(compose)

        self.prompt.installEventFilter(self)
        state.session.running_changed.connect(lambda running: None if running else self.refresh_runs())
        state.session.running_changed.connect(lambda _running: self._update_buttons())
        self.refresh_runs()
        self._update_buttons()

    # ---- sources ----
    def refresh_runs(self) -> None:
        from hone.core.api import list_runs

        runs_dir = Path(self.state.config.output.runs_dir)
        current = self.run_box.currentData()
        self.run_box.clear()
        if runs_dir.is_dir():
            for summary in list_runs(runs_dir):
                if summary.has_adapter:
                    self.run_box.addItem(Path(summary.run_dir).name, {"run_dir": str(summary.run_dir)})
        self.run_box.addItem(
            f"Base model only: {self.state.config.model.name_or_path}", {"model": self.state.config.model.name_or_path}
        )
        if current:
            index = self.run_box.findData(current)
            self.run_box.setCurrentIndex(max(0, index))

    def select_run(self, run_dir: str) -> None:
        index = self.run_box.findData({"run_dir": str(run_dir)})
        if index < 0:
            self.run_box.addItem(Path(run_dir).name, {"run_dir": str(run_dir)})
            index = self.run_box.count() - 1
        self.run_box.setCurrentIndex(index)

    def load_selected(self) -> None:
        source = self.run_box.currentData()
        if source:
            self.load(source)

    def load(self, source: dict[str, Any]) -> None:
        """Load the chosen run's base + adapter (or a base alone) on the chat thread."""
        self._ensure_engine()
        self.source = dict(source)
        self.loaded = False
        self.busy.show()
        self.status.setText("Loading the models…")
        set_role(self.status, "muted")
        self._update_buttons()
        self._load_requested.emit(source)

    def _ensure_engine(self) -> None:
        if self.thread is not None:
            return
        self.thread = QThread()
        self.thread.setObjectName("chat")
        self.engine = ChatEngine()
        self.engine.moveToThread(self.thread)
        self._load_requested.connect(self.engine.load)
        self._generate_requested.connect(self.engine.generate)
        self._evaluate_requested.connect(self.engine.evaluate)
        self.engine.eval_progress.connect(self._eval_progress)
        self.engine.evaluated.connect(self._evaluated)
        self.engine.loaded.connect(self._loaded)
        self.engine.piece.connect(self._piece)
        self.engine.reply_done.connect(self._reply_done)
        self.engine.failed.connect(self._failed)
        self.thread.start()

    @Slot(object)
    def _loaded(self, loaded: tuple[str, bool]) -> None:
        text, self.has_adapter = loaded
        self.loaded = True
        self.busy.hide()
        self.status.setText(f"Ready: {text}.")
        self.clear()
        self._update_buttons()

    def sides(self) -> tuple[str, ...]:
        return (BASE, TUNED) if self.has_adapter else (BASE,)

    @Slot(object)
    def _failed(self, error) -> None:
        self.busy.hide()
        self.status.setText(f"{error.message}" + (f" — {error.advice}" if error.advice else ""))
        set_role(self.status, "error")
        self._update_buttons()

    # ---- chatting ----
    def send(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text or not self.loaded or self.generating:
            return
        self.prompt.clear()
        for side in self.sides():
            self.history[side].append({"role": "user", "content": text})
            self.transcripts[side].add_user(text)
            self.replies[side] = ""
        self.generating = True
        self.stop_flag.clear()
        self._update_buttons()
        settings = {"max_new_tokens": self.max_tokens.value(), "temperature": self.temperature.value()}
        self._generate_requested.emit(
            {
                "base": list(self.history[BASE]),
                "tuned": list(self.history[TUNED]),
                "settings": settings,
                "stop": self.stop_flag,
            }
        )

    @Slot(object)
    def _piece(self, piece: tuple[str, str]) -> None:
        side, text = piece
        self.replies[side] += text
        self.transcripts[side].add_piece(text)

    @Slot()
    def _reply_done(self) -> None:
        for side in self.sides():
            self.history[side].append({"role": "assistant", "content": self.replies[side]})
        self.generating = False
        self._update_buttons()
        self.reply_finished.emit()

    # ---- evaluating ----
    def evaluate(self, path: str | Path | None = None, rows: int = 20) -> None:
        """Score both models on held-out rows: `path`, else the loaded run's evaluation file, else one the user
        picks; the first `rows` rows with a reference (0 = all)."""
        if not self.loaded or not self.has_adapter or self.generating:
            return
        config = self._preference_config()
        if config is not None:  # its held-out pairs (data.eval, or those eval_fraction held out) unless given a file
            where = f"{Path(path).name}" if path is not None else "the run's held-out pairs"
            request = {"path": str(path) if path is not None else None, "rows": rows, "config": config}
        else:
            if path is None:
                path = self._held_out_file()
            if path is None:
                return
            where = Path(path).name
            request = {"path": str(path), "rows": rows, "stop": self.stop_flag}
        self.generating = True
        self.stop_flag.clear()
        self.status.setText(f"Evaluating on {where}…")
        set_role(self.status, "muted")
        self._update_buttons()
        self._evaluate_requested.emit(request)

    def _preference_config(self):
        """The loaded run's config when it trained on pairs (DPO, SimPO, ORPO), else None."""
        from hone.core.config import PREFERENCE_METHODS, RunConfig
        from hone.core.errors import HoneError

        if not self.source.get("run_dir"):
            return None
        try:
            config = RunConfig.load(Path(self.source["run_dir"]) / "config.toml")
        except HoneError:
            return None
        return config if config.train.method in PREFERENCE_METHODS else None

    def _held_out_file(self) -> str | None:
        from hone.core.api import held_out_file
        from hone.core.config import RunConfig
        from hone.core.errors import HoneError

        if self.source.get("run_dir"):
            try:
                return str(held_out_file(RunConfig.load(Path(self.source["run_dir"]) / "config.toml")))
            except HoneError:
                pass  # no evaluation file: ask for one
        chosen, _ = QFileDialog.getOpenFileName(self, "Held-out rows", "", "Rows (*.jsonl *.json *.txt);;All (*)")
        return chosen or None

    @Slot(object)
    def _eval_progress(self, progress: tuple[int, int]) -> None:
        done, total = progress
        self.status.setText(f"Evaluating: {done} of {total} rows scored by both models…")

    @Slot(object)
    def _evaluated(self, result) -> None:
        self.generating = False
        self._update_buttons()
        name = Path(self.source.get("run_dir") or self.source.get("model", "")).name
        if isinstance(result, tuple):
            comparison, skipped = result
            self.status.setText(comparison.summary()[0].upper() + comparison.summary()[1:] + ".")
            set_role(self.status, "muted")
            self.evaluation_dialog = EvaluationDialog(f"Evaluation of {name}", comparison, skipped, self)
            self.evaluation_dialog.show()
        elif result is not None:  # a preference run's ranking of its held-out pairs
            summary = preference_summary(result)
            self.status.setText(summary[0].upper() + summary[1:] + ".")
            set_role(self.status, "muted")
            self.evaluation_dialog = PreferenceDialog(f"Evaluation of {name}", result, self)
            self.evaluation_dialog.show()
        self.evaluation_finished.emit()

    def clear(self) -> None:
        if self.generating:
            return
        self.history = {BASE: [], TUNED: []}
        for transcript in self.transcripts.values():
            transcript.clear()
        if self.loaded and not self.has_adapter:
            self.transcripts[TUNED].setPlainText("No adapter loaded: choose a run to compare with its fine-tune.")

    def _update_buttons(self) -> None:
        self.send_button.setEnabled(self.loaded and not self.generating)
        self.evaluate_button.setEnabled(self.loaded and self.has_adapter and not self.generating)
        self.stop_button.setEnabled(self.generating)
        training = self.state.session.is_running
        # a model loaded next to a training run competes for its memory (and on a GPU, can push it out of it)
        self.load_button.setEnabled(not self.generating and not self.busy.isVisible() and not training)
        self.load_button.setToolTip(
            "Wait for the training run to finish (or stop it) to load models here."
            if training
            else "Load the chosen run's base model and its fine-tune."
        )
        self.generating_label.setVisible(self.generating)

    def eventFilter(self, watched, event) -> bool:
        from PySide6.QtCore import QEvent

        if (
            watched is self.prompt
            and event.type() == QEvent.KeyPress
            and event.key() in (Qt.Key_Return, Qt.Key_Enter)
            and event.modifiers() & Qt.ControlModifier
        ):
            self.send()
            return True
        return super().eventFilter(watched, event)

    def shown(self) -> None:
        if not self.generating:
            self.refresh_runs()

    def shutdown(self) -> None:
        """Stop any reply and end the chat thread (called when the window closes)."""
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(30_000)

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.send_button.setIcon(icon("send", "#ffffff", 14))
        self.stop_button.setIcon(icon("stop", palette.text, 14))
        for transcript in self.transcripts.values():
            transcript.accent = palette.accent

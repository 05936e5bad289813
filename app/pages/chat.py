"""Chat page: the base model and the fine-tuned model answer side by side, streaming, off the GUI thread.

The worker that loads and runs the models is `chat_engine.ChatEngine`; the evaluation dialogs are in `chat_dialogs`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QThread, Signal, Slot
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QWidget,
)

from hone.app.model_names import model_name
from hone.app.pages.base import Page
from hone.app.pages.chat_dialogs import EvaluationDialog, PreferenceDialog, preference_summary
from hone.app.pages.chat_engine import ChatEngine
from hone.app.pages.chat_widgets import ElidedComboBox, Transcript
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, label, set_role
from hone.app.widgets.config_form import FloatSpinBox
from hone.core.api import BASE, CHAT_REPETITION_PENALTY, TUNED

__all__ = ["ChatEngine", "ChatPage", "EvaluationDialog", "PreferenceDialog", "Transcript", "preference_summary"]

# What the empty panes say: what to do next, before a model is loaded, and on the fine-tune's side without one.
EMPTY_BASE = "Pick a run above and press Load models, or chat with the base model alone."
EMPTY_TUNED = "Pick a run above and press Load models: its fine-tune answers here, beside the base model."
NO_ADAPTER = "No adapter loaded: pick a run above and press Load models to compare the base with its fine-tune."
LOADED_EMPTY = "Ask something below (Ctrl+Enter sends)."
DEFAULT_REPETITION_PENALTY = CHAT_REPETITION_PENALTY  # as `hone chat` starts (hone.core.inference.chat says why)
SYSTEM_TIP = "Sent before the conversation as a system message (system_prompt)."


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
        self.system_refusal = ""  # why the loaded model's chat template takes no system prompt, "" when it does
        self._then_evaluate = False  # open_run(evaluate=True): evaluate once the run is loaded

        source = Card()
        row = QHBoxLayout()
        row.addWidget(label("Fine-tuned run"))
        self.run_box = ElidedComboBox()  # a long run or model name ends in "…" with the whole name as tooltip
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
        self.status = label(
            "Pick a run and press Load models (its base model comes from the run's settings), or chat with the base "
            "model alone.",
            "muted",
            wrap=True,
        )
        source.body.addWidget(self.busy)
        source.body.addWidget(self.status)
        self.body.addWidget(source)

        panes = QHBoxLayout()
        panes.setSpacing(12)
        self.transcripts: dict[str, Transcript] = {}
        for side, title in ((BASE, "Base model"), (TUNED, "Fine-tuned")):
            card = Card(title)
            transcript = Transcript()
            transcript.set_empty_text(EMPTY_BASE if side == BASE else EMPTY_TUNED)
            card.body.addWidget(transcript)
            self.transcripts[side] = transcript
            panes.addWidget(card, 1)
        self.body.addLayout(panes, 1)

        compose = Card()
        prompt_row = QHBoxLayout()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Ask something… (Ctrl+Enter sends)")
        self.prompt.setAccessibleName("Message to the model")
        self.prompt.setFixedHeight(64)
        self.prompt.setTabChangesFocus(True)  # Tab moves on to Send (a tab character in a question is never meant)
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
        for settings_row in self._settings_rows():
            compose.body.addLayout(settings_row)
        self.body.addWidget(compose)

        self.prompt.installEventFilter(self)
        state.session.running_changed.connect(lambda running: None if running else self.refresh_runs())
        state.session.running_changed.connect(lambda _running: self._update_buttons())
        self.refresh_runs()
        self._update_buttons()

    def _settings_rows(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """How replies are written, in two rows that fit the window's minimum width: max new tokens, temperature and
        top-p; then the repetition penalty and the system prompt (config keys in the tooltips)."""
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 8192)
        self.max_tokens.setValue(256)
        self.max_tokens.setToolTip("The longest reply, in tokens (max_new_tokens).")
        self.temperature = FloatSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setValue(0.0)
        self.temperature.setToolTip(
            "0 = greedy: the most likely token each time, the same reply every time (temperature)."
        )
        self.top_p = _fraction_box(0.01, 1.0, 1.0)
        self.top_p.setToolTip(
            "With a temperature above 0, pick only among the most likely tokens that together reach this probability; "
            "1 = all tokens (top_p)."
        )
        self.repetition_penalty = _fraction_box(1.0, 2.0, DEFAULT_REPETITION_PENALTY)
        self.repetition_penalty.setToolTip(
            "Above 1, words already in the conversation become less likely, which stops a reply repeating itself "
            "until the token limit; 1 = off (repetition_penalty)."
        )
        self.system_prompt = QLineEdit()
        self.system_prompt.setPlaceholderText("Optional: how the assistant should behave")
        self.system_prompt.setToolTip(SYSTEM_TIP)
        self.generating_label = label("Generating…", "muted")
        self.generating_label.setToolTip("The reply is being written; Stop ends it where it is.")
        rows = QHBoxLayout(), QHBoxLayout()
        for row, pairs in (
            (rows[0], (("Max new tokens", self.max_tokens), ("Temperature", self.temperature), ("Top-p", self.top_p))),
            (rows[1], (("Repetition penalty", self.repetition_penalty), ("System prompt", self.system_prompt))),
        ):
            for text, box in pairs:
                row.addWidget(label(text, "muted"))
                row.addWidget(box, 1 if box is self.system_prompt else 0)
                row.addSpacing(10)
        rows[0].addStretch(1)
        rows[1].addWidget(self.generating_label)
        return rows

    def settings(self) -> dict[str, Any]:
        """The sampling settings as GenerationSettings takes them; no system prompt where the template takes none."""
        return {
            "max_new_tokens": self.max_tokens.value(),
            "temperature": self.temperature.value(),
            "top_p": self.top_p.value(),
            "repetition_penalty": self.repetition_penalty.value(),
            "system_prompt": "" if self.system_refusal else self.system_prompt.text().strip(),
        }

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
        base = self.state.config.model.name_or_path
        self.run_box.addItem(f"Base model only: {model_name(base)}", {"model": base})
        if current and current.get("run_dir") and Path(current["run_dir"]).is_dir():  # a run from elsewhere stays
            self.select_run(current["run_dir"])
        elif current:
            self.run_box.setCurrentIndex(max(0, self.run_box.findData(current)))

    def select_run(self, run_dir: str) -> None:
        index = self.run_box.findData({"run_dir": str(run_dir)})
        if index < 0:
            self.run_box.addItem(Path(run_dir).name, {"run_dir": str(run_dir)})
            index = self.run_box.count() - 1
        self.run_box.setCurrentIndex(index)

    def offer_run(self, run_dir: str) -> None:
        """A run just ended with an adapter: make it the chosen run, unless a reply, an evaluation or a load is under
        way (the user's choice then stays)."""
        if self.generating or self.busy.isVisible():
            return
        self.select_run(run_dir)
        if self.source.get("run_dir") != str(run_dir):
            self.status.setText(
                f"{Path(run_dir).name} is ready: press Load models to chat with its fine-tune beside the base model."
            )
            set_role(self.status, "muted")

    def open_run(self, run_dir: str, *, evaluate: bool = False) -> bool:
        """Chat with `run_dir` (the Monitor's "Chat with it"), or evaluate it: choose it, load it unless it is
        loaded, then evaluate where asked. False (nothing changes) while a reply, evaluation or load is under way."""
        if self.generating or self.busy.isVisible():
            return False
        self.select_run(run_dir)
        self._then_evaluate = evaluate
        if self.loaded and self.source == {"run_dir": str(run_dir)}:
            self._evaluate_if_asked()
        else:
            self.load({"run_dir": str(run_dir)})
        return True

    def _evaluate_if_asked(self) -> None:
        if self._then_evaluate:
            self._then_evaluate = False
            self.evaluate()

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
    def _loaded(self, loaded: tuple[str, bool, str]) -> None:
        text, self.has_adapter, self.system_refusal = loaded
        self.loaded = True
        self.busy.hide()
        note = ""
        if self.system_refusal:
            note = f" The system prompt is not used: {self.system_refusal}."
        self.status.setText(f"Ready: {text}.{note}")
        self.system_prompt.setEnabled(not self.system_refusal)
        self.system_prompt.setToolTip(f"Not used: {self.system_refusal}." if self.system_refusal else SYSTEM_TIP)
        self.transcripts[BASE].set_empty_text(LOADED_EMPTY)
        self.transcripts[TUNED].set_empty_text(LOADED_EMPTY if self.has_adapter else NO_ADAPTER)
        self.clear()
        self._update_buttons()
        self._evaluate_if_asked()

    def sides(self) -> tuple[str, ...]:
        return (BASE, TUNED) if self.has_adapter else (BASE,)

    @Slot(object)
    def _failed(self, error) -> None:
        self._then_evaluate = False
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
        self._generate_requested.emit(
            {
                "base": list(self.history[BASE]),
                "tuned": list(self.history[TUNED]),
                "settings": self.settings(),
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
            transcript.clear()  # an empty pane says what to do (Transcript.set_empty_text)

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


def _fraction_box(low: float, high: float, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setDecimals(2)
    box.setSingleStep(0.05)
    box.setValue(value)
    return box

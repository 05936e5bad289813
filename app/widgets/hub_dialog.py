"""Search the Hub…: find a model on the Hugging Face Hub by name, see whether it fits this machine, download it with
a progress bar (pause stops, resume continues where it stopped), and use it.

Every request runs through `Task` on a worker thread (hone.core.hub); the dialog only shows plain results. The
access token for gated models goes to the OS keyring (hone.core.hub.token), never into the settings or a config.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hone.app.widgets.common import human_bytes, human_count, label, set_role
from hone.app.widgets.config_form import in_words
from hone.app.workers import Task, TaskError

COLUMNS = ("Model", "Size", "Downloads", "License", "Gated")
# The core's messages name environment variables (the command line's words); the dialog says what they do.
ENV_WORDS = (
    ("HF_HUB_OFFLINE is set", "offline mode is on for the Hugging Face Hub", "HF_HUB_OFFLINE"),
    ("unset HF_HUB_OFFLINE", "turn offline mode off", "HF_HUB_OFFLINE"),
)
PROGRESS_STEPS = 1000  # the bar's range: tenths of a percent


def _env_words(text: str) -> tuple[str, list[str]]:
    """`text` with ENV_WORDS' phrases in words, and the variables they named (each once)."""
    names = []
    for phrase, words, name in ENV_WORDS:
        if phrase in text:
            text = text.replace(phrase, words)
            names += [name] if name not in names else []
    return text, names


def search(text: str) -> list:
    """HubModel rows (on a worker thread)."""
    from hone.core.api import search_models

    return search_models(text, limit=50)


def download(repo_id: str, stop: threading.Event, progress=None):
    """A DownloadResult (on a worker thread); `progress` gets DownloadProgress values."""
    from hone.core.api import download_model

    return download_model(repo_id, stop=stop, progress=progress)


def save_token(token: str) -> None:
    from hone.core.api import save_token as save

    save(token)


class HubDialog(QDialog):
    """The dialog. `model_chosen(repo_id)` is emitted by Use model, once the model is downloaded.

    `fit_check(repo_id)` runs on a worker thread and returns an object with `fits` (True, False or None) and `text`
    (the Model page passes the memory planner's, hone.core.hub.machine_fit); None shows sizes only.
    """

    model_chosen = Signal(str)

    def __init__(self, fit_check=None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Search the Hugging Face Hub")
        self.resize(820, 560)
        self.fit_check = fit_check
        self.results: list[Any] = []
        self.search_task: Task | None = None
        self.download_task: Task | None = None
        self.fit_task: Task | None = None
        self.stop = threading.Event()
        self.downloaded: set[str] = set()
        self.downloading = ""

        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Part of a model's name: qwen3, smollm2, llama…")
        self.query.returnPressed.connect(self.search)
        self.search_button = set_role(QPushButton("Search"), "primary")
        self.search_button.clicked.connect(self.search)
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        layout.addLayout(row)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.itemSelectionChanged.connect(self._selected)
        self.table.itemDoubleClicked.connect(lambda _item: self.download())
        layout.addWidget(self.table, 1)

        self.fit_label = label("", "muted", wrap=True, selectable=True)
        self.status = label(
            "Search by name; the most downloaded models come first.", "muted", wrap=True, selectable=True
        )
        self.progress = QProgressBar()
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.setTextVisible(False)
        self.progress.hide()
        for widget in (self.fit_label, self.progress, self.status):
            layout.addWidget(widget)

        buttons = QHBoxLayout()
        self.token_button = QPushButton("Token…")
        self.token_button.setToolTip("A Hugging Face access token for gated models, kept in the OS keyring.")
        self.token_button.clicked.connect(self._ask_token)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download)
        self.pause_button = QPushButton("Pause")
        self.pause_button.clicked.connect(self.pause_or_resume)
        self.use_button = set_role(QPushButton("Use model"), "primary")
        self.use_button.clicked.connect(self.use)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons.addWidget(self.token_button)
        buttons.addStretch(1)
        for button in (self.download_button, self.pause_button, self.use_button, close):
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self._update_buttons()

    # ---- searching ----
    def search(self) -> None:
        text = self.query.text().strip()
        if self.search_task and self.search_task.is_running():
            return
        if not text:
            self._say("Type part of a model's name first.", "error")
            return
        self.search_button.setEnabled(False)
        self._say(f"Searching the Hub for “{text}”…")
        self.search_task = Task(search, text, on_result=self._show_results, on_error=self._failed)
        self.search_task.finished.connect(lambda: self.search_button.setEnabled(True))

    def _show_results(self, models: list) -> None:
        self.results = list(models)
        self.table.setRowCount(len(self.results))
        for r, model in enumerate(self.results):
            size = human_bytes(model.weight_bytes) if model.weight_bytes else "?"
            if model.parameters:
                size = f"{size} · {human_count(model.parameters)}"
            cells = (
                model.id,
                size,
                f"{model.downloads:,}",
                model.license or "—",
                f"yes ({model.gated})" if model.gated else "no",
            )
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c in (1, 2):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self._say(
            f"{len(self.results)} models; pick one to download."
            if self.results
            else "No model on the Hub has that in its name."
        )
        self._update_buttons()

    def selected(self) -> Any | None:
        rows = self.table.selectionModel().selectedRows()
        return self.results[rows[0].row()] if rows else None

    def _selected(self) -> None:
        model = self.selected()
        self._update_buttons()
        self.fit_label.setText("")
        if model is None or self.fit_check is None:
            return
        gated = " It is gated: accept its license on the Hub and give Hone a token (Token…)." if model.gated else ""
        self.fit_label.setText(f"Checking whether {model.id} fits this machine…{gated}")
        self.fit_task = Task(
            self.fit_check,
            model.id,
            on_result=lambda verdict: self._show_fit(model.id, verdict),
            on_error=lambda error: self._show_fit(model.id, None),
        )

    def _show_fit(self, repo_id: str, verdict: Any) -> None:
        current = self.selected()
        if current is None or current.id != repo_id:
            return  # the user moved on to another row
        if verdict is None:
            self.fit_label.setText("Whether it fits this machine is not known.")
            return
        mark = {True: "✓", False: "✗"}.get(verdict.fits, "?")
        self.fit_label.setText(f"{mark} {repo_id} {verdict.text}.")
        set_role(self.fit_label, "error" if verdict.fits is False else "muted")

    # ---- downloading ----
    def download(self) -> None:
        model = self.selected()
        if model is None or self.is_downloading():
            return
        self.downloading = model.id
        self.stop = threading.Event()
        self.progress.setValue(0)
        self.progress.show()
        self._say(f"Downloading {model.id}…")
        self.download_task = Task(
            download,
            model.id,
            self.stop,
            on_progress=self._progressed,
            on_result=self._downloaded,
            on_error=self._failed,
        )
        self.download_task.finished.connect(self._update_buttons)
        self._update_buttons()

    def pause_or_resume(self) -> None:
        if self.is_downloading():
            self.stop.set()
            self._say("Pausing…")
        elif self.downloading:
            self._select(self.downloading)
            self.download()

    def _progressed(self, p: Any) -> None:
        self.progress.setValue(round(p.fraction * PROGRESS_STEPS))
        self._say(
            f"{human_bytes(p.done)} of {human_bytes(p.total)} · file {min(p.files_done + 1, p.files_total)} "
            f"of {p.files_total}: {p.file}"
        )

    def _downloaded(self, result: Any) -> None:
        self.progress.setValue(round(result.done / result.total * PROGRESS_STEPS) if result.total else PROGRESS_STEPS)
        if result.complete:
            self.downloaded.add(result.repo_id)
            self.downloading = ""
            self._say(
                f"{result.repo_id} is downloaded ({human_bytes(result.total)}). Use model makes it the run's model."
            )
        else:
            self._say(
                f"Paused at {human_bytes(result.done)} of {human_bytes(result.total)}. Resume continues where "
                "it stopped."
            )
        self._update_buttons()

    def is_downloading(self) -> bool:
        return bool(self.download_task and self.download_task.is_running())

    def use(self) -> None:
        model = self.selected()
        if model is not None and model.id in self.downloaded:
            self.model_chosen.emit(model.id)
            self.accept()

    # ---- the token ----
    def _ask_token(self) -> None:
        token, ok = QInputDialog.getText(
            self,
            "Hugging Face token",
            "A read token from huggingface.co/settings/tokens. Hone keeps it in the OS keyring, never in a config.",
            QLineEdit.Password,
        )
        if ok and token.strip():
            Task(
                save_token,
                token,
                on_result=lambda _: self._say("The token is kept in the OS keyring."),
                on_error=self._failed,
            )

    # ---- showing ----
    def _failed(self, error: TaskError) -> None:
        said, names = _env_words(f"{error.message}\n{error.advice}")
        message, _, advice = said.partition("\n")
        advice = f" {in_words(advice.rstrip('.'))}." if advice.strip() else ""
        self._say(f"{in_words(message.rstrip('.'))}.{advice}", "error")
        # the environment variable behind it, for those who set it (the words above say what it does)
        self.status.setToolTip(f"Set by the environment variable {', '.join(names)}." if names else "")
        self._update_buttons()

    def _say(self, text: str, role: str = "muted") -> None:
        self.status.setText(text)
        set_role(self.status, role)

    def _select(self, repo_id: str) -> None:
        for r, model in enumerate(self.results):
            if model.id == repo_id:
                self.table.selectRow(r)

    def _update_buttons(self) -> None:
        model = self.selected()
        busy = self.is_downloading()
        self.download_button.setEnabled(model is not None and not busy and model.id not in self.downloaded)
        self.pause_button.setText("Pause" if busy or not self.downloading else "Resume")
        self.pause_button.setEnabled(busy or bool(self.downloading))
        self.use_button.setEnabled(model is not None and model.id in self.downloaded and not busy)

    def done(self, result: int) -> None:
        """Closing the dialog stops a download (what arrived is kept; the next one continues)."""
        self.stop.set()
        super().done(result)

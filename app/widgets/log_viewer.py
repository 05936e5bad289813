"""A run's whole train.log in a dialog: read on a worker thread and put into the view a piece at a time, so a long
log never freezes the window; find next / previous (case-insensitive), Copy all, Open in the system's editor.

The Monitor's log pane keeps the last few thousand lines; this dialog is where the rest is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QColor, QDesktopServices, QFontDatabase, QGuiApplication, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from hone.app.task_errors import TaskError
from hone.app.widgets.common import human_bytes, label, set_role
from hone.app.workers import Task

# The most of a log the dialog shows: its last bytes. A text view holds 20 MB (a run of millions of step lines)
# and still scrolls and searches at once; a longer log's start is in the file, which "Open in editor" opens whole.
LOG_VIEW_LIMIT = 20 * 2**20
# Characters put into the view per turn of the event loop: ~256 KB lays out in a few tens of ms on a slow CPU,
# so the window answers clicks and repaints between pieces while a long log comes in.
PIECE_CHARS = 256 * 1024
# Colour of the match the search found (the selection shows it too, but only while the view has the focus).
MATCH_COLOUR = "#ffd54f"


@dataclass(frozen=True)
class LogText:
    """What of a log the dialog shows: `text` (whole lines), the file's `size` in bytes, the bytes `cut` from its
    start to keep within the limit (0: the whole file)."""

    text: str
    size: int
    cut: int


def read_log(path: str | Path, limit: int | None = None) -> LogText:
    """The last `limit` bytes (default LOG_VIEW_LIMIT) of the log at `path`, from its first whole line on; bytes
    that are not UTF-8 read as U+FFFD. Runs on a worker thread.

    Raises:
        OSError: the file cannot be read.
    """
    limit = LOG_VIEW_LIMIT if limit is None else limit
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = max(0, size - limit)
        f.seek(start)
        data = f.read(size - start)
    if start:  # the cut falls inside a line: start at the next whole one
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    return LogText(data.decode("utf-8", errors="replace"), size, size - len(data))


def _read(path: str) -> LogText:
    try:
        return read_log(path)
    except OSError as e:
        raise OSError(f"{path} could not be read ({e.strerror or e})") from None


class LogViewer(QDialog):
    """The log at `path`, read in the background; `loaded` fires once all of it is in the view (or it failed)."""

    loaded = Signal()

    def __init__(self, path: str | Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.path = Path(path)
        self.setWindowTitle(f"{self.path.parent.name} — {self.path.name}")
        self.resize(1000, 700)
        self._loaded = False
        self._pending: list[str] = []

        self.search = QLineEdit()
        self.search.setPlaceholderText("Find in the log")
        self.search.setClearButtonEnabled(True)
        self.search.returnPressed.connect(self.find_next)
        self.previous_button = QPushButton("Previous")
        self.previous_button.setToolTip("Find the match before this one.")
        self.previous_button.clicked.connect(self.find_previous)
        self.next_button = QPushButton("Next")
        self.next_button.setToolTip("Find the next match, ignoring case (Enter in the search box).")
        self.next_button.clicked.connect(self.find_next)
        self.found = label("", "muted")
        find_row = QHBoxLayout()
        find_row.addWidget(self.search, 1)
        for widget in (self.previous_button, self.next_button, self.found):
            find_row.addWidget(widget)

        self.note = label("Reading the log…", "muted", wrap=True, selectable=True)
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.text.setUndoRedoEnabled(False)  # pieces come in through a cursor; nothing to undo in a read-only view

        self.copy_button = QPushButton("Copy all")
        self.copy_button.setToolTip("Copy the whole log as shown here to the clipboard.")
        self.copy_button.clicked.connect(self.copy_all)
        self.editor_button = QPushButton("Open in editor")
        self.editor_button.setToolTip(f"Open {self.path} in the program this system opens .log files with.")
        self.editor_button.clicked.connect(self.open_in_editor)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addWidget(self.copy_button)
        buttons.addWidget(self.editor_button)
        buttons.addStretch(1)
        buttons.addWidget(close)

        layout = QVBoxLayout(self)
        layout.addLayout(find_row)
        layout.addWidget(self.note)
        layout.addWidget(self.text, 1)
        layout.addLayout(buttons)
        self._set_ready(False)
        self._feeder = QTimer(self)
        self._feeder.setInterval(0)
        self._feeder.timeout.connect(self._feed)
        self.task = Task(_read, str(self.path), on_result=self._got, on_error=self._failed)

    def is_loaded(self) -> bool:
        return self._loaded

    # ---- loading ----
    def _got(self, log: LogText) -> None:
        if not isValid(self):  # closed while the file was read
            return
        if log.cut:
            self.note.setText(
                f"The log is {human_bytes(log.size)}: the last {human_bytes(log.size - log.cut)} are shown here. "
                "Open in editor shows all of it."
            )
        else:
            self.note.hide()
        text = log.text.removesuffix("\n")
        self._pending = [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]
        self._pending.reverse()  # popped from the end: the first piece first
        self._feed()
        if self._pending:
            self._feeder.start()

    def _feed(self) -> None:
        """Put the next piece into the view (one per turn of the event loop)."""
        if self._pending:
            cursor = QTextCursor(self.text.document())
            cursor.movePosition(QTextCursor.End)
            cursor.insertText(self._pending.pop())
        if not self._pending:
            self._feeder.stop()
            self.text.moveCursor(QTextCursor.End)  # a log is read from its end: the outcome, the last steps
            self._set_ready(True)
            self._done()

    def _failed(self, error: TaskError) -> None:
        if not isValid(self):
            return
        self.note.setText(f"{error.message}. Check that the run folder is still there.")
        set_role(self.note, "error")
        self._done()

    def _done(self) -> None:
        self._loaded = True
        self.loaded.emit()

    def _set_ready(self, ready: bool) -> None:
        for widget in (self.search, self.previous_button, self.next_button, self.copy_button):
            widget.setEnabled(ready)

    # ---- finding ----
    def find_next(self) -> bool:
        return self._find(QTextDocument.FindFlag(0))

    def find_previous(self) -> bool:
        return self._find(QTextDocument.FindBackward)

    def _find(self, flags: QTextDocument.FindFlag) -> bool:
        """Select and highlight the next (or previous) match of the search text, wrapping around the ends."""
        needle = self.search.text()
        if not needle:
            return False
        found = self.text.find(needle, flags)  # no FindCaseSensitively: case is ignored
        if not found:  # wrap: from the other end
            cursor = self.text.textCursor()
            cursor.movePosition(QTextCursor.End if flags & QTextDocument.FindBackward else QTextCursor.Start)
            self.text.setTextCursor(cursor)
            found = self.text.find(needle, flags)
        highlights = []
        if found:
            match = QTextEdit.ExtraSelection()
            match.cursor = self.text.textCursor()
            match.format.setBackground(QColor(MATCH_COLOUR))
            match.format.setForeground(QColor("#000000"))
            highlights.append(match)
            self.text.centerCursor()
        self.text.setExtraSelections(highlights)
        self.found.setText("" if found else "Not found")
        return found

    # ---- the whole log ----
    def copy_all(self) -> None:
        QGuiApplication.clipboard().setText(self.text.toPlainText())

    def open_in_editor(self) -> bool:
        opened = QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.path)))
        if not opened:
            self.note.setText(f"No program opened {self.path}: open it from the run folder instead.")
            set_role(self.note, "error")
            self.note.show()
        return opened


def open_log_viewer(run_dir: str | Path, parent: QWidget) -> LogViewer:
    """Show the train.log of the run in `run_dir` in a new LogViewer (it deletes itself when closed)."""
    from hone.core.api import LOG_FILE

    viewer = LogViewer(Path(run_dir) / LOG_FILE, parent)
    viewer.setAttribute(Qt.WA_DeleteOnClose)
    viewer.show()
    return viewer

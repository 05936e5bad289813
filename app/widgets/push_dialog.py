"""Push to the Hub…: ask where an export goes on the Hugging Face Hub (OWNER/NAME, private or not).

The Export page runs the push itself (hone.core.hub.push on a `Task`); this dialog only asks. Its repository field
starts as NAME alone and becomes USER/NAME once the Hub has said whose the token is (`hub_user`, on a worker thread),
unless the user has typed in it by then.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFrame,
    QLineEdit,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from hone.app.accessibility import prepare
from hone.app.widgets.common import label, set_role
from hone.app.workers import Task


def hub_user() -> str:
    """The token's account name, or "" (on a worker thread: it asks the Hub)."""
    from hone.core.api import hub_user as ask

    return ask()


WIDTH = 560  # px: wide enough for OWNER/NAME at a glance, narrow enough for the window's 980 px minimum


def breakable(path: str) -> str:
    """`path` with a zero-width space after each separator, so a long path wraps at its folders (a label wraps only
    where breaking is allowed; a path without spaces would otherwise widen the dialog past the window)."""
    return path.replace("/", "/\u200b").replace("\\", "\\\u200b").replace("_", "_\u200b")


class PushDialog(QDialog):
    """The dialog; `push_asked(repo_id, private)` is emitted by Push."""

    push_asked = Signal(str, bool)

    def __init__(self, folder: str, name: str, parent: QWidget | None = None):
        """Args:
        folder: the export folder to push (shown).
        name: the repository name to suggest (the run's name and the format: my-run-adapter).
        """
        super().__init__(parent)
        self.setWindowTitle("Push to the Hugging Face Hub")
        self.name = name
        self.typed = False
        outer = QVBoxLayout(self)
        # the text sits in a scroll area: it wraps to the dialog's width and the dialog takes the height that needs
        # (_fit), never more than the window it opens over; the buttons stay in view below
        self.body = QWidget()
        layout = QVBoxLayout(self.body)
        layout.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.body)
        outer.addWidget(self.scroll, 1)
        layout.addWidget(
            label(
                f"Uploads {breakable(folder)} with its model card (README.md) in one commit. The repository is "
                "created if it does not exist.",
                "muted",
                wrap=True,
            )
        )
        layout.addWidget(label("Repository (OWNER/NAME)"))
        self.repo_edit = QLineEdit(name)
        self.repo_edit.setPlaceholderText("your-user-name/" + name)
        self.repo_edit.textEdited.connect(self._edited)
        layout.addWidget(self.repo_edit)
        self.private_box = QCheckBox("Private: only you (and your organization) can see it")
        self.private_box.setChecked(True)
        layout.addWidget(self.private_box)
        self.note = label("Asking the Hub whose the token is…", "muted", wrap=True)
        layout.addWidget(self.note)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.push_button = set_role(self.buttons.addButton("Push", QDialogButtonBox.AcceptRole), "primary")
        self.buttons.accepted.connect(self._push)
        self.buttons.rejected.connect(self.reject)
        layout.addStretch(1)
        outer.addWidget(self.buttons)
        self.resize(min(WIDTH, self._room().width()), 1)
        self._fit()
        self._edited(name)
        prepare(self)  # accessible names and Tab order (hone.app.accessibility)
        self.user_task = Task(hub_user, on_result=self._got_user, on_error=lambda _error: self._got_user(""))

    def _room(self) -> QSize:
        """The most the dialog may take: the window it opens over, else the screen."""
        parent = self.parentWidget()
        if parent is not None:
            return parent.window().size()
        screen = self.screen() or QGuiApplication.primaryScreen()
        return screen.availableSize()

    def _fit(self) -> None:
        """Make the dialog as high as its wrapped text needs at its width, within `_room` (then it scrolls)."""
        outer = self.layout()
        margins = outer.contentsMargins()
        inner_width = self.width() - margins.left() - margins.right()
        needed = (
            self.body.layout().totalHeightForWidth(inner_width)
            + outer.spacing()
            + self.buttons.sizeHint().height()
            + margins.top()
            + margins.bottom()
        )
        self.resize(self.width(), min(needed, self._room().height()))

    def _got_user(self, user: str) -> None:
        if user:
            self.note.setText(f"The token Hone has belongs to {user}.")
            if not self.typed:
                self.repo_edit.setText(f"{user}/{self.name}")
                self._edited(self.repo_edit.text(), typed=False)
        else:
            self.note.setText(
                "Hone has no token that the Hub accepts, so the owner is not known: type your user "
                "name. Pushing needs a token that can write (Token… in Search the Hub, or HF_TOKEN)."
            )
        self._fit()  # the note may now take more lines

    def _edited(self, text: str, typed: bool = True) -> None:
        self.typed = self.typed or (typed and text != self.name)
        self.push_button.setEnabled("/" in text.strip())

    def repo_id(self) -> str:
        return self.repo_edit.text().strip()

    def _push(self) -> None:
        if "/" in self.repo_id():
            self.push_asked.emit(self.repo_id(), self.private_box.isChecked())
            self.accept()

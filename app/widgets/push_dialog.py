"""Push to the Hub…: ask where an export goes on the Hugging Face Hub (OWNER/NAME, private or not).

The Export page runs the push itself (hone.core.hub.push on a `Task`); this dialog only asks. Its repository field
starts as NAME alone and becomes USER/NAME once the Hub has said whose the token is (`hub_user`, on a worker thread),
unless the user has typed in it by then.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QLineEdit, QVBoxLayout, QWidget

from hone.app.widgets.common import label, set_role
from hone.app.workers import Task


def hub_user() -> str:
    """The token's account name, or "" (on a worker thread: it asks the Hub)."""
    from hone.core.api import hub_user as ask

    return ask()


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
        layout = QVBoxLayout(self)
        layout.addWidget(
            label(
                f"Uploads {folder} with its model card (README.md) in one commit. The repository is "
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
        layout.addWidget(self.buttons)
        self.resize(560, self.sizeHint().height())
        self._edited(name)
        self.user_task = Task(hub_user, on_result=self._got_user, on_error=lambda _error: self._got_user(""))

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

    def _edited(self, text: str, typed: bool = True) -> None:
        self.typed = self.typed or (typed and text != self.name)
        self.push_button.setEnabled("/" in text.strip())

    def repo_id(self) -> str:
        return self.repo_edit.text().strip()

    def _push(self) -> None:
        if "/" in self.repo_id():
            self.push_asked.emit(self.repo_id(), self.private_box.isChecked())
            self.accept()

"""What to do with a run that finished with an adapter, offered on the Monitor: chat with it, evaluate it, export it.

The buttons only ask (`asked`); the window switches to the page and selects the run there.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from hone.app.widgets.common import label, set_role
from hone.core.events import RunFailed, RunFinished

CHAT, EVALUATE, EXPORT = "chat", "evaluate", "export"


def run_with_adapter(ended: RunFinished | RunFailed | None) -> str:
    """The run folder of a run that ended with an adapter saved (finished, or stopped after saving), else ""."""
    if not isinstance(ended, RunFinished) or not ended.adapter_dir:
        return ""
    return str(ended.run_dir) if (Path(ended.adapter_dir) / "adapter_config.json").is_file() else ""


class RunNextSteps(QWidget):
    """The buttons "Chat with it", "Evaluate" and "Export" for the run shown, once it ended with an adapter."""

    asked = Signal(str, str)  # (CHAT | EVALUATE | EXPORT, run folder)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.run_dir = ""
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 4, 0, 0)
        row.addWidget(label("Next:", "muted"))
        self.chat_button = set_role(QPushButton("Chat with it"), "primary")
        self.chat_button.setToolTip("Open Chat with this run loaded: its fine-tune answers beside the base model.")
        self.evaluate_button = QPushButton("Evaluate")
        self.evaluate_button.setToolTip(
            "Open Chat, load this run and score the base and the fine-tune on its held-out rows."
        )
        self.export_button = QPushButton("Export")
        self.export_button.setToolTip("Open Export with this run chosen: write its adapter, a merged model or GGUF.")
        buttons = ((CHAT, self.chat_button), (EVALUATE, self.evaluate_button), (EXPORT, self.export_button))
        for action, button in buttons:
            button.clicked.connect(lambda _checked=False, a=action: self.asked.emit(a, self.run_dir))
            row.addWidget(button)
        row.addStretch(1)
        self.hide()

    def show_for(self, ended: RunFinished | RunFailed | None, training: bool) -> None:
        """Shown for a run that ended with an adapter; hidden while one trains and for runs without one."""
        self.run_dir = "" if training else run_with_adapter(ended)
        self.setVisible(bool(self.run_dir))

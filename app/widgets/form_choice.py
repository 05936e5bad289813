"""The Train page's choice between its Basic and Advanced forms, and under it one line on the settings Basic hides
that differ from their defaults (or from the preset they differ least from): hidden, they still apply."""

from __future__ import annotations

import functools
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QButtonGroup, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from hone.app.presets import PRESETS
from hone.app.widgets.common import label, set_role
from hone.app.widgets.config_form import ConfigForm, field_label
from hone.core.config import RunConfig

DEFAULTS = "the defaults"


class FormChoice(QWidget):
    """Two buttons, Basic and Advanced (one checked); `chosen` carries "basic" or "advanced" on a click."""

    chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.group = QButtonGroup(self)  # exclusive: one of the two is checked
        self.basic_button = set_role(QPushButton("Basic"), "preset")
        self.basic_button.setToolTip(
            "The settings most runs change: method, length, learning rate, LoRA rank and QLoRA. The others keep "
            "their values (automatic by default) and still apply."
        )
        self.advanced_button = set_role(QPushButton("Advanced"), "preset")
        self.advanced_button.setToolTip("Every setting: speed paths, memory, data handling, saving and more.")
        for button, form in ((self.basic_button, "basic"), (self.advanced_button, "advanced")):
            button.setCheckable(True)
            button.clicked.connect(lambda _=False, form=form: self.chosen.emit(form))
            self.group.addButton(button)
            row.addWidget(button)
        row.addStretch(1)
        column.addLayout(row)
        self.note = label("", "muted", wrap=True)
        self.note.hide()
        column.addWidget(self.note)

    def set_form(self, form: str) -> None:
        self.basic_button.setChecked(form == "basic")
        self.advanced_button.setChecked(form != "basic")

    def show_changes(self, changes: list[tuple[str, Any, Any]], where: str) -> None:
        """Say how many hidden settings differ from `where` ("the defaults" or a preset's name), naming them; their
        values against `where`'s in the tooltip. No changes: no line."""
        self.note.setVisible(bool(changes))
        if not changes:
            return
        names = [field_label(key) for key, _value, _base in changes]
        named = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
        count = f"{len(changes)} advanced setting{'s' if len(changes) != 1 else ''}"
        self.note.setText(f"{count} changed from {where}: {named}.")
        base_word = "default" if where == DEFAULTS else f"{where}:"
        self.note.setToolTip(
            "\n".join(f"{field_label(key)}: {_value_text(v)} ({base_word} {_value_text(b)})" for key, v, b in changes)
            + "\n\nHidden in Basic, they still apply; Advanced shows them."
        )


def hidden_changes(form: ConfigForm) -> tuple[list[tuple[str, Any, Any]], str]:
    """The form's hidden changes against the defaults or against the preset they differ least from (the defaults on
    a tie: a preset's own values are what the user chose), and which that is (DEFAULTS or the preset's name)."""
    values = form.values()
    found = [(form.hidden_changes(config, values), name) for name, config in _baselines()]
    return min(found, key=lambda pair: len(pair[0]))


@functools.cache
def _baselines() -> tuple[tuple[str, RunConfig], ...]:
    """The defaults and each preset applied to them: what hidden changes are counted against (fixed, built once)."""
    base = RunConfig()
    return ((DEFAULTS, base), *((preset.name, preset.apply(base)) for preset in PRESETS))


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)

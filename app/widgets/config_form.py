"""The Train page's settings form, generated from RunConfig's field metadata (one source of truth).

Each field's type picks its editor (bool -> check box, choices -> combo box, int/float -> spin box bounded by
the field's min/max, list -> comma-separated text), its help text becomes the tooltip, and every value is
validated by the config classes themselves as the user types, with the message shown under the field.
Fields chosen on other pages (model, data files) are not repeated here but pass through unchanged.

In Basic (`set_basic(True)`) only BASIC_FIELDS show, with the chosen training method's own card; every other editor
is hidden, never reset: its value still goes into `config()`, and `hidden_changes` says which differ from a baseline.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import typing
from typing import Any

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hone.app.presets import PREFERENCE_FAMILY
from hone.app.widgets.common import Card, Columns, label, set_invalid
from hone.core.config import SECTIONS, RunConfig
from hone.core.errors import ConfigError

# Chosen on the Model and Data pages; the form leaves them alone.
ELSEWHERE = {"model.name_or_path", "model.gguf_file", "data.train", "data.eval", "data.format", "data.columns"}

SECTION_ORDER = ("train", "preference", "grpo", "lora", "speed", "data", "model", "output")
# What a beginner chooses (issue 43): the method, how long, how fast it learns, the adapter's size and 4-bit base.
# Model and data are chosen on their pages; the presets and the memory estimate are the Train page's own.
BASIC_FIELDS = ("train.method", "train.max_steps", "train.epochs", "train.lr", "lora.r", "lora.qlora")
# A training method's own card, shown in Basic while that method is chosen (its settings apply to it alone).
METHOD_SECTIONS = {"preference": PREFERENCE_FAMILY, "grpo": ("grpo",)}
# Where runs go, not how they train (the Studio puts it in the user's documents, away from RunConfig's default).
NOT_A_CHANGE = {"output.runs_dir"}
# Settings written as JSON in one line, with the example their box shows: GRPO's rewards (a list of tables), the
# prompts answered at each evaluation (a list of prompts, or a number of evaluation rows).
JSON_EXAMPLES = {
    "grpo.rewards": '[{"kind": "exact", "column": "answer"}]',
    "train.sample_prompts": '["What is 2 + 2?", "Name a colour."], or 3 for the first evaluation rows',
}
JSON_FIELDS = set(JSON_EXAMPLES)
SECTION_TITLES = {
    "train": "Training",
    "preference": "Preference training",
    "grpo": "Reinforcement learning (GRPO)",
    "lora": "LoRA adapter",
    "speed": "Speed",
    "data": "Data",
    "model": "Model loading",
    "output": "Output",
}

# Shorter labels where the field name alone reads poorly; others are derived from the name.
LABELS = {
    "lora.r": "Rank",
    "lora.rslora": "rsLoRA",
    "lora.qlora": "QLoRA (4-bit base)",
    "lora.experts": "Adapt experts (MoE)",
    "lora.train_projector": "Train projector",
    "lora.train_vision_tower": "LoRA on vision tower",
    "train.lr": "Learning rate",
    "train.max_steps": "Max steps",
    "train.grad_accum": "Gradient accumulation",
    "train.max_grad_norm": "Clip grad norm",
    "train.batch_tokens": "Tokens per batch",
    "speed.moe_backend": "MoE backend",
    "speed.checkpoint": "Activation checkpoints",
    "speed.kernels": "Fused kernels",
    "speed.compile": "torch.compile",
    "speed.host_embeddings": "Input embeddings in host memory",
    "speed.host_lm_head": "LM head in host memory",
    "speed.layer_group_tokens": "Layer groups (tokens)",
    "speed.keep_layer_activations": "Layers not recomputed (-1 = auto)",
    "data.train_on": "Train on",
    "data.max_length": "Max length (tokens)",
    "data.image_max_side": "Image max side (px)",
    "data.eval_fraction": "Eval fraction",
    "data.chat_template": "Chat template",
    "model.trust_remote_code": "Trust remote code",
    "output.runs_dir": "Runs folder",
    "output.name": "Run name",
    "model.name_or_path": "Model",
    "data.train": "Training data",
    "data.eval": "Evaluation data",
    "speed.tiled_mlp": "Tiled MLP backward",
    "speed.loss": "Loss",
    "speed.attention": "Attention",
    "speed.long_row_attention": "Long rows through cuDNN",
    "speed.keep_long_row_attention": "Keep long-row attention",
    "speed.grouped_attention_backward": "Grouped attention backward",
    "output.checkpoint_every": "Checkpoint every",
    "output.keep_checkpoints": "Checkpoints kept",
    "train.eval_every": "Evaluate every (steps)",
    "model.dtype": "Weight type",
    "train.parallel": "Several GPUs",
    "train.method": "Method",
    "preference.beta": "Beta",
    "preference.loss": "DPO loss",
    "preference.label_smoothing": "Label smoothing",
    "preference.simpo_gamma": "SimPO gamma",
}
# Choices in words; the value the config stores is each item's data (and in its tooltip).
CHOICE_LABELS = {
    "speed.moe_backend": {
        "auto": "Auto",
        "grouped_mm": "grouped_mm",
        "triton": "Triton",
        "torch": "PyTorch",
        "eager": "transformers eager",
    },
    "speed.checkpoint": {
        "auto": "Auto",
        "off": "Off (keep every activation)",
        "gpu": "Recompute",
        "offload": "Offload to host memory",
        "offload-double": "Offload, two reload buffers",
    },
    "speed.attention": {
        "auto": "Auto",
        "varlen": "Varlen (PyTorch)",
        "flash": "FlashAttention",
        "sdpa": "SDPA with a block mask",
        "hf": "transformers' own",
    },
    "speed.long_row_attention": {"auto": "Auto (Hopper GPUs)", "on": "On", "off": "Off"},
    "speed.loss": {"chunked": "Chunked (less memory)", "plain": "Plain (all logits at once)"},
    "train.schedule": {"cosine": "Cosine decay", "linear": "Linear decay", "constant": "Constant"},
    "train.optimizer": {"adamw": "AdamW", "adamw-bf16": "AdamW, 16-bit state", "adamw8bit": "AdamW 8-bit"},
    "train.parallel": {"auto": "Auto", "ddp": "Whole model on each GPU", "fsdp": "Split the model across GPUs"},
    "train.method": {
        "sft": "Supervised fine-tuning",
        "dpo": "DPO (chosen over rejected)",
        "simpo": "SimPO (no reference model)",
    },
    "preference.loss": {"sigmoid": "Sigmoid (DPO)", "ipo": "IPO", "robust": "Robust (noisy labels)"},
    "model.dtype": {"auto": "Auto", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"},
    "data.overlong": {"truncate": "Truncate", "drop": "Drop the row"},
    "data.train_on": {"assistant": "Assistant replies", "all": "Every token"},
}

_WHERE = re.compile(r"^(?:[^:]*: )?(?:unknown setting )?(\w+)\.(\w+)")


def field_label(key: str) -> str:
    if key in LABELS:
        return LABELS[key]
    return key.split(".", 1)[1].replace("_", " ").capitalize()


class FloatSpinBox(QDoubleSpinBox):
    """A float spin box that shows values compactly (2e-04 stays readable) and steps by a tenth of the order
    of magnitude of the value, so learning rates and ratios step sensibly."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setDecimals(12)
        self.setStepType(QAbstractSpinBox.AdaptiveDecimalStepType)
        self.setKeyboardTracking(True)

    def textFromValue(self, value: float) -> str:
        return f"{value:.6g}"

    def valueFromText(self, text: str) -> float:
        try:
            return float(text.strip())
        except ValueError:
            return self.value()

    def validate(self, text: str, pos: int):
        from PySide6.QtGui import QValidator

        stripped = text.strip()
        try:
            value = float(stripped)
        except ValueError:
            partial = re.fullmatch(r"[-+]?(\d*\.?\d*([eE][-+]?)?)?", stripped) is not None
            return (QValidator.Intermediate if partial else QValidator.Invalid), text, pos
        ok = self.minimum() <= value <= self.maximum() and math.isfinite(value)
        return (QValidator.Acceptable if ok else QValidator.Intermediate), text, pos


class ConfigForm(QWidget):
    """Editors for every RunConfig field not chosen elsewhere, in section cards.

    `changed` fires on every user edit (not while `set_config` fills the editors); `errors()` maps field keys to
    messages; `config()` returns the validated RunConfig or raises ConfigError.
    """

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._base = RunConfig()
        self._base_dict = self._base.to_dict()
        # errors() for one set of editor values over one base config: a page asks several times per refresh, and
        # checking every field alone builds each section's dataclass once per field
        self._checked: tuple[RunConfig, dict[str, Any], dict[str, str]] | None = None
        self.editors: dict[str, QWidget] = {}
        self._error_labels: dict[str, QLabel] = {}
        self._notes: dict[str, QLabel] = {}
        self._rows: dict[str, tuple[QFormLayout, QWidget]] = {}  # key -> its form and the cell holding its editor
        self._basic = False
        self._arranged: list[str] = []
        self._hints = {name: typing.get_type_hints(cls) for name, cls in SECTIONS.items()}
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.columns = Columns(2)  # one column where the window is too narrow for two
        outer.addWidget(self.columns)
        # Columns places its widgets in a fixed grid: the cards go into slots in order, so that the cards Basic shows
        # sit side by side without gaps where hidden ones would be.
        self._slots: list[QVBoxLayout] = []
        for _ in SECTION_ORDER:
            slot = QWidget()
            layout = QVBoxLayout(slot)
            layout.setContentsMargins(0, 0, 0, 0)
            self._slots.append(layout)
            self.columns.add(slot)
        self.cards: dict[str, Card] = {section: self._section_card(section) for section in SECTION_ORDER}
        self.set_config(self._base)

    # ---- building ----
    def _section_card(self, section: str) -> Card:
        cls = SECTIONS[section]
        card = Card(SECTION_TITLES[section], (cls.__doc__ or "").strip().splitlines()[0])
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignLeft | Qt.AlignVCenter)
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        form.setHorizontalSpacing(14)
        form.setVerticalSpacing(6)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            if key in ELSEWHERE:
                continue
            editor = self._editor(key, self._hints[section][f.name], f.metadata)
            if editor is None:
                continue
            help_text = f.metadata.get("help", "").replace("`", "") + f"\n\n{key}"
            editor.setToolTip(help_text)
            editor.setObjectName(key)
            name = QLabel(field_label(key))
            name.setToolTip(help_text)
            cell = QWidget()
            column = QVBoxLayout(cell)
            column.setContentsMargins(0, 0, 0, 0)
            column.setSpacing(2)
            column.addWidget(editor)
            note = label("", "muted", wrap=True)
            note.hide()
            error = label("", "error", wrap=True)
            error.hide()
            column.addWidget(note)
            column.addWidget(error)
            form.addRow(name, cell)
            self._rows[key] = (form, cell)
            self.editors[key] = editor
            self._notes[key] = note
            self._error_labels[key] = error
        card.body.addLayout(form)
        return card

    def _editor(self, key: str, hint: Any, meta: Any) -> QWidget | None:
        if key in JSON_FIELDS:
            editor = QLineEdit()
            editor.setPlaceholderText(f"JSON, e.g. {JSON_EXAMPLES[key]}")
            editor.textChanged.connect(self._edited)
            return editor
        choices = meta.get("choices")
        low, high = meta.get("min"), meta.get("max")
        if choices:
            editor = QComboBox()
            names = CHOICE_LABELS.get(key, {})
            for choice in choices:
                editor.addItem(names.get(choice, choice), choice)
                editor.setItemData(editor.count() - 1, f"{key} = {choice}", Qt.ToolTipRole)
            editor.currentIndexChanged.connect(self._edited)
        elif hint is bool:
            editor = QCheckBox()
            editor.toggled.connect(self._edited)
        elif hint is int:
            editor = QSpinBox()
            editor.setRange(int(low) if low is not None else -(2**31), int(high) if high is not None else 2**31 - 1)
            editor.setGroupSeparatorShown(True)
            editor.valueChanged.connect(self._edited)
        elif hint is float:
            editor = FloatSpinBox()
            editor.setRange(low if low is not None else -1e12, high if high is not None else 1e12)
            editor.lineEdit().textChanged.connect(self._edited)  # also fires for typed values outside the bounds
        elif hint is str or typing.get_origin(hint) is list:
            editor = QLineEdit()
            if typing.get_origin(hint) is list:
                editor.setPlaceholderText("comma-separated")
            editor.textChanged.connect(self._edited)
        else:  # tables (data.columns) are edited on their own page
            return None
        return editor

    # ---- model -> view ----
    def set_config(self, config: RunConfig) -> None:
        """Show `config` in the editors without emitting `changed` (each editor's signals are blocked)."""
        self._base = config
        self._base_dict = data = config.to_dict()
        for key, editor in self.editors.items():
            section, name = key.split(".")
            value = data[section][name]
            with QSignalBlocker(editor):
                if isinstance(editor, QComboBox):
                    editor.setCurrentIndex(max(0, editor.findData(value)))
                elif isinstance(editor, QCheckBox):
                    editor.setChecked(bool(value))
                elif isinstance(editor, (QSpinBox, QDoubleSpinBox)):
                    editor.setValue(value)
                elif key in JSON_FIELDS:
                    editor.setText(json.dumps(value))
                elif isinstance(editor, QLineEdit):
                    editor.setText(", ".join(value) if isinstance(value, list) else str(value))
        self._show_errors(self.errors())
        self._show_mode()

    # ---- Basic and Advanced ----
    def set_basic(self, basic: bool) -> None:
        """Show only the Basic settings (and the chosen method's card), or every setting; no value changes."""
        self._basic = basic
        self._show_mode()

    def is_basic(self) -> bool:
        return self._basic

    def _method(self) -> str:
        return self.editors["train.method"].currentData()

    def _section_shown(self, section: str) -> bool:
        if not self._basic:
            return True
        if section in METHOD_SECTIONS:
            return self._method() in METHOD_SECTIONS[section]
        return any(key.startswith(f"{section}.") for key in BASIC_FIELDS)

    def _key_shown(self, key: str) -> bool:
        section = key.split(".", 1)[0]
        return self._section_shown(section) and (not self._basic or section in METHOD_SECTIONS or key in BASIC_FIELDS)

    def _show_mode(self) -> None:
        for key, (form, cell) in self._rows.items():
            form.setRowVisible(cell, self._key_shown(key))
        shown = [section for section in SECTION_ORDER if self._section_shown(section)]
        if shown == self._arranged:
            return
        self._arranged = shown
        for slot in self._slots:
            while slot.count():
                slot.takeAt(0)
        for section in SECTION_ORDER:
            if section not in shown:
                self.cards[section].hide()
                self.cards[section].setParent(self)  # kept (with its values), out of the layout
        for slot, section in zip(self._slots, shown):
            slot.addWidget(self.cards[section])
            self.cards[section].show()
        for i, slot in enumerate(self._slots):
            slot.parentWidget().setVisible(i < len(shown))

    def hidden_changes(
        self, baseline: RunConfig, values: dict[str, dict[str, Any]] | None = None
    ) -> list[tuple[str, Any, Any]]:
        """(key, value, baseline's value) of each hidden editor whose value differs from `baseline`'s, in the form's
        order. A method card's settings never count: Basic shows the chosen method's card, and another method's
        settings do not apply. `values` is `values()` when the caller already has it."""
        values, base = values if values is not None else self.values(), baseline.to_dict()
        changes = []
        for key in self.editors:
            section, name = key.split(".")
            if self._key_shown(key) or key in NOT_A_CHANGE or section in METHOD_SECTIONS:
                continue
            if values[section][name] != base[section][name]:
                changes.append((key, values[section][name], base[section][name]))
        return changes

    # ---- view -> model ----
    def values(self) -> dict[str, dict[str, Any]]:
        """The config as a dict, with every editor's current value in place of the base config's."""
        return self._values(self._editor_values())

    def _values(self, edited: dict[str, Any]) -> dict[str, dict[str, Any]]:
        data = copy.deepcopy(self._base_dict)  # a copy the caller may change
        for key, value in edited.items():
            section, name = key.split(".")
            data[section][name] = value
        return data

    def _editor_values(self) -> dict[str, Any]:
        return {key: self._editor_value(key, editor) for key, editor in self.editors.items()}

    def _editor_value(self, key: str, editor: QWidget) -> Any:
        if isinstance(editor, QComboBox):
            return editor.currentData()
        if isinstance(editor, QCheckBox):
            return editor.isChecked()
        if isinstance(editor, QSpinBox):
            return editor.value()
        if isinstance(editor, QDoubleSpinBox):
            text = editor.cleanText().strip()
            try:  # what is typed, not the last acceptable value, so an out-of-range entry is reported
                return float(text)
            except ValueError:
                return text
        if key in JSON_FIELDS:
            try:
                return json.loads(editor.text() or "[]")
            except ValueError:
                return editor.text()  # not JSON: the section's check names the field and what it takes
        section, name = key.split(".")
        if typing.get_origin(self._hints[section][name]) is list:
            return [part.strip() for part in editor.text().split(",") if part.strip()]
        return editor.text()

    def config(self) -> RunConfig:
        """The validated config; raises ConfigError naming the first bad field."""
        return RunConfig.from_dict(self.values(), source="the form")

    def errors(self) -> dict[str, str]:
        """field key -> message, for every field (checked alone) and every section (checked whole)."""
        edited = self._editor_values()
        if self._checked is not None and self._checked[0] is self._base and self._checked[1] == edited:
            return dict(self._checked[2])
        found = self._check(self._values(edited))
        self._checked = (self._base, edited, found)
        return dict(found)

    def _check(self, data: dict[str, dict[str, Any]]) -> dict[str, str]:
        found: dict[str, str] = {}
        for section, cls in SECTIONS.items():
            for name, value in data[section].items():
                try:
                    cls(**{name: value})
                except ConfigError as e:
                    if _field_of(e) in (f"{section}.{name}", None):  # cross-field checks: judged whole below
                        found[f"{section}.{name}"] = _sentence(e)
            if not any(k.startswith(f"{section}.") for k in found):
                try:
                    cls(**data[section])
                except ConfigError as e:
                    found[_field_of(e) or f"{section}."] = _sentence(e)
        if not found:  # checks across sections live on RunConfig itself
            try:
                RunConfig.from_dict(data, source="the form")
            except ConfigError as e:
                found[_field_of(e) or "run."] = _sentence(e)
        return found

    def is_valid(self) -> bool:
        return not self.errors()

    # ---- notes and enabling (the MoE backend on dense models, what Auto picked) ----
    def set_note(self, key: str, text: str) -> None:
        note = self._notes[key]
        note.setText(text)
        note.setVisible(bool(text))

    def note(self, key: str) -> str:
        return self._notes[key].text()

    def error_text(self, key: str) -> str:
        return "" if self._error_labels[key].isHidden() else self._error_labels[key].text()

    def set_enabled(self, key: str, enabled: bool) -> None:
        self.editors[key].setEnabled(enabled)

    def _edited(self, *_: Any) -> None:
        self._show_errors(self.errors())
        self._show_mode()  # a new method shows its own card in Basic
        self.changed.emit()

    def _show_errors(self, errors: dict[str, str]) -> None:
        for key, error_label in self._error_labels.items():
            message = errors.get(key, "")
            error_label.setText(message)
            error_label.setVisible(bool(message))
            set_invalid(self.editors[key], bool(message))


def _field_of(error: ConfigError) -> str | None:
    """The `section.field` a ConfigError's message starts with (the config's messages all name their field)."""
    match = _WHERE.match(error.message)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _sentence(error: ConfigError) -> str:
    text = f"{error.message} — {error.advice}." if error.advice else f"{error.message}."
    return in_words(text)


_KEY = re.compile(r"`?\b(" + "|".join(SECTIONS) + r")\.(\w+)\b`?")


def in_words(text: str) -> str:
    """`text` with every `section.field` key replaced by the field's label as the form shows it ("train.lr" ->
    "Learning rate"), and the first letter capitalized; keys stay in the tooltips."""

    def label_of(match: re.Match) -> str:
        section, name = match.group(1), match.group(2)
        known = name in {f.name for f in dataclasses.fields(SECTIONS[section])}
        return f"“{field_label(f'{section}.{name}')}”" if known else match.group(0)

    text = _KEY.sub(label_of, text)
    return text[:1].upper() + text[1:]

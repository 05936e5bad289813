"""Model page: choose a Hugging Face id (with recents), a local folder or a GGUF file, and see what it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QProgressBar, QPushButton, QWidget

from hone.app.helper_process import in_helper
from hone.app.jobs import read_model
from hone.app.model_names import model_name
from hone.app.pages.base import Page
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, InfoGrid, StatTile, human_bytes, human_count, label, set_role
from hone.app.widgets.config_form import in_words
from hone.app.widgets.hub_dialog import HubDialog
from hone.app.workers import Task, TaskError
from hone.core.api import family_of
from hone.core.config import DEMO_MODEL

DETAILS = ["Architecture", "Model type", "Layers", "Hidden size", "Vocabulary", "Context length", "Source", "Experts"]


def fits_here(repo_id: str, config) -> Any:
    """The memory planner's verdict for training `repo_id` with `config`'s settings here (on a worker thread)."""
    from hone.core.api import fits_this_machine

    return fits_this_machine(repo_id, config)


class ModelPage(Page):
    name = "model"
    title = "Model"
    subtitle = "Pick the model to fine-tune: a Hugging Face id, a local folder, or a GGUF file."
    icon_name = "model"

    inspected = Signal(object)  # ModelInfo dict, or TaskError

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.task: Task | None = None
        self.hub_dialog: HubDialog | None = None
        self.hub_button = QPushButton("Search the Hub…")
        self.hub_button.setToolTip(
            "Find a model on the Hugging Face Hub by name, see whether it fits this machine, and download it."
        )
        self.hub_button.clicked.connect(self.open_hub)
        self.header.actions.addWidget(self.hub_button)

        source = Card("Source", "Type a Hugging Face id such as Qwen/Qwen3-0.6B, or pick a folder or a .gguf file.")
        row = QHBoxLayout()
        row.setSpacing(8)
        self.name_box = QComboBox()
        self.name_box.setEditable(True)
        self.name_box.setInsertPolicy(QComboBox.NoInsert)
        self.name_box.lineEdit().setPlaceholderText("Qwen/Qwen3-0.6B, /path/to/model, model.gguf")
        self.name_box.lineEdit().returnPressed.connect(self.use_typed)
        row.addWidget(self.name_box, 1)
        self.folder_button = QPushButton("Folder…")
        self.folder_button.clicked.connect(self._pick_folder)
        self.gguf_button = QPushButton("GGUF file…")
        self.gguf_button.clicked.connect(self._pick_gguf)
        self.use_button = set_role(QPushButton("Use model"), "primary")
        self.use_button.clicked.connect(self.use_typed)
        for button in (self.folder_button, self.gguf_button, self.use_button):
            row.addWidget(button)
        source.body.addLayout(row)
        demo_row = QHBoxLayout()
        self.demo_button = QPushButton("Use the demo model")
        self.demo_button.setToolTip("SmolLM2-135M-Instruct, bundled with Hone Studio: trains on any machine.")
        self.demo_button.clicked.connect(lambda: self.choose(DEMO_MODEL))
        demo_row.addWidget(self.demo_button)
        demo_row.addWidget(
            label("SmolLM2-135M-Instruct ships with Hone Studio and needs no download.", "muted", wrap=True), 1
        )  # wraps rather than widen the page past the window
        demo_row.addStretch(1)
        source.body.addLayout(demo_row)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # indeterminate: reading a config has no measurable progress
        self.busy.setMaximumHeight(6)
        self.busy.hide()
        self.status = label("", "muted", wrap=True, selectable=True)
        source.body.addWidget(self.busy)
        source.body.addWidget(self.status)
        self.body.addWidget(source)

        tiles = QHBoxLayout()
        tiles.setSpacing(12)
        self.name_tile = StatTile("Model")
        self.params_tile = StatTile("Parameters")
        self.kind_tile = StatTile("Kind")
        self.vision_tile = StatTile("Input")
        for tile in (self.name_tile, self.params_tile, self.kind_tile, self.vision_tile):
            tiles.addWidget(tile)
        self.body.addLayout(tiles)

        details = Card("Details", "Read from the model's configuration; weights load when training or chat starts.")
        self.details = InfoGrid(DETAILS)
        details.body.addWidget(self.details)
        self.body.addWidget(details)
        self.family_card = Card(
            "Mixture of experts",
            "What Hone runs for this model's family, and what stays on "
            "transformers' path (the run's first lines say what was checked on the weights).",
        )
        self.family_text = label("", wrap=True, selectable=True)
        self.family_card.body.addWidget(self.family_text)
        self.family_card.hide()
        self.body.addWidget(self.family_card)
        self.body.addStretch(1)

        self._refresh_recents()
        self.name_box.setEditText(model_name(state.config.model.name_or_path))
        state.model_info_changed.connect(self._show_info)
        self._show_info(state.model_info)
        if state.model_info is None:
            self._say("Details appear once you choose a model (press Use model).")

    # ---- choosing ----
    def use_typed(self) -> None:
        text = self.name_box.currentText().strip()
        index = self.name_box.findText(text)  # a listed model shows its name; its id is the item's data
        self.choose(self.name_box.itemData(index) if index >= 0 else text)

    def choose(self, name_or_path: str) -> None:
        """Read `name_or_path`'s details off the GUI thread; it becomes the run's model only once it could be read
        (a model that cannot be read leaves the previous one in place)."""
        if not name_or_path:
            self._say("Type a model id or pick a folder or file first.")
            return
        if self.task and self.task.is_running():
            return
        self.name_box.setEditText(model_name(name_or_path))
        self.busy.show()
        self.use_button.setEnabled(False)
        set_role(self.status, "muted")
        self._say(f"Reading {model_name(name_or_path)}…")
        self.task = Task(
            in_helper(read_model),  # torch and transformers load in the helper process, not the window's
            name_or_path,
            on_result=lambda info: self._inspected(name_or_path, info),
            on_error=lambda error: self._failed(name_or_path, error),
        )

    def _inspected(self, name_or_path: str, info: Any) -> None:
        self.busy.hide()
        self.use_button.setEnabled(True)
        self._say("")
        self.state.set_model(name_or_path, info)
        self._refresh_recents()
        self.inspected.emit(self.state.model_info)

    def _failed(self, name_or_path: str, error: TaskError) -> None:
        self.busy.hide()
        self.use_button.setEnabled(True)
        advice = f"\n{in_words(error.advice.rstrip('.'))}." if error.advice else ""
        current = self.state.config.model.name_or_path
        kept = f"\nThe run still uses {model_name(current)}." if current and current != name_or_path else ""
        message = error.message.rstrip(".")
        if message.startswith(name_or_path):  # "x does not exist": the message names the model, say it once
            said = f"{name_or_path}{in_words(message[len(name_or_path) :])}."
        else:
            said = f"Could not read {name_or_path}: {in_words(message)}."
        self._say(f"{said}{advice}{kept}")
        set_role(self.status, "error")
        self.inspected.emit(error)

    def _say(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def open_hub(self) -> HubDialog:
        """The Search the Hub dialog (one at a time); Use model there chooses the model here."""
        if self.hub_dialog is None:
            self.hub_dialog = HubDialog(lambda repo_id: fits_here(repo_id, self.state.config), self)
            self.hub_dialog.model_chosen.connect(self.choose)
        self.hub_dialog.show()
        self.hub_dialog.raise_()
        return self.hub_dialog

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder")
        if folder:
            self.choose(folder)

    def _pick_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.choose(path)

    def _refresh_recents(self) -> None:
        text = self.name_box.currentText()
        self.name_box.blockSignals(True)
        self.name_box.clear()
        recents = self.state.settings.recent_models()
        for name in recents + ([DEMO_MODEL] if DEMO_MODEL not in recents else []):
            self.name_box.addItem(model_name(name), name)
            self.name_box.setItemData(self.name_box.count() - 1, name, Qt.ToolTipRole)  # the id, for configs
        self.name_box.setEditText(text)
        self.name_box.blockSignals(False)

    # ---- showing ----
    def _show_info(self, info: dict[str, Any] | None) -> None:
        set_role(self.status, "muted")
        if info is None:  # never read on this computer: reading it would load torch, so it waits for Use model
            for tile in (self.params_tile, self.kind_tile, self.vision_tile):
                tile.set("—", "")
            self.name_tile.set(_short(self.state.config.model.name_or_path), "press Use model for its details")
            self.details.clear()
            return
        params = info.get("params", 0)
        self.name_tile.set(
            _short(info.get("name") or self.state.config.model.name_or_path), info.get("source_kind", "")
        )
        self.params_tile.set(
            human_count(params), f"{human_bytes(params * 2)} in 16-bit · {human_bytes(params * 0.5)} in 4-bit"
        )
        if info.get("is_moe"):
            self.kind_tile.set("MoE", f"{info.get('num_experts', 0)} experts, top-{info.get('experts_per_token', 0)}")
        else:
            self.kind_tile.set("Dense", "every parameter used per token")
        self.vision_tile.set("Vision + text" if info.get("is_vision") else "Text", "")
        self.details.set("Architecture", str(info.get("architecture", "—")))
        self.details.set("Model type", str(info.get("model_type", "—")))
        self.details.set("Layers", str(info.get("layers", "—")))
        self.details.set("Hidden size", f"{info.get('hidden_size', 0):,}")
        self.details.set("Vocabulary", f"{info.get('vocab_size', 0):,} tokens")
        self.details.set("Context length", f"{info.get('context_length', 0):,} tokens")
        self.details.set("Source", str(info.get("source_kind", "—")))
        self.details.set(
            "Experts",
            f"{info.get('num_experts')} (top-{info.get('experts_per_token')})"
            if info.get("is_moe")
            else "none (dense)",
        )
        self._show_family(info)

    def _show_family(self, info: dict[str, Any]) -> None:
        """The MoE family's row of the family table; hidden for dense models."""
        if not info.get("is_moe"):
            self.family_card.hide()
            return
        model_type = str(info.get("model_type", ""))
        family = family_of(model_type)
        experts = (
            "experts: Hone's grouped GEMMs with LoRA per expert, where transformers stores them as 3-D "
            "weights (checked when the model loads)"
        )
        if family is None:
            lines = [f"{model_type}: a family without a row in Hone's table", experts]
        else:
            lines = [family.name, f"router: {family.router}", experts, f"attention: {family.attention}"]
            if family.plain:
                lines.append(f"on transformers' path: {family.plain}")
        lines.append("GGUF export: not for MoE models yet (export merged, then convert with llama.cpp)")
        self.family_text.setText("\n".join(lines))
        self.family_card.show()

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.folder_button.setIcon(icon("folder", palette.text, 16))
        self.gguf_button.setIcon(icon("file", palette.text, 16))
        self.demo_button.setIcon(icon("sparkle", palette.accent, 16))

    def is_busy(self) -> bool:
        return bool(self.task and self.task.is_running()) or bool(self.hub_dialog and self.hub_dialog.is_downloading())


def _short(name: str) -> str:
    """A model name that fits a tile: the last path part, the bundled name without its prefix."""
    if name.startswith("bundled:"):
        return model_name(name)
    path = Path(name)
    return path.name if (path.is_absolute() or len(path.parts) > 2) else name

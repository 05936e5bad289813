"""The Studio's shared state: the run config being prepared, what is known about the chosen model, and the
training session. Pages read it and change it through these methods; its signals keep the others in step."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from PySide6.QtCore import QObject, Signal

from hone.app.data_readiness import DataReadiness
from hone.app.settings import Settings
from hone.app.workers import TrainerFactory, TrainSession
from hone.core.api import MachineFacts
from hone.core.config import RunConfig


class AppState(QObject):
    """One per window.

    Signals:
        config_changed(RunConfig): the config changed (a page edited it, a preset was applied).
        model_info_changed(dict | None): details of the chosen model (ModelInfo as a dict), None while unknown.
        page_requested(str): a page asks the window to show another page (e.g. Start -> Monitor).
        machine_changed(MachineFacts): what this computer can run became known (read in the background at start).
    """

    config_changed = Signal(object)
    model_info_changed = Signal(object)
    page_requested = Signal(str)
    machine_changed = Signal(object)

    def __init__(self, settings: Settings, trainer: TrainerFactory | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.settings = settings
        self.config: RunConfig = settings.config()
        self.model_info: dict[str, Any] | None = self._cached_model_info(self.config.model.name_or_path)
        self.session = TrainSession(trainer, self)
        self.machine: MachineFacts | None = None  # None until read; nothing is refused for the machine until then
        self.data_readiness = DataReadiness(self)  # whether the training data has a usable row (read in the background)

    def set_machine(self, machine: MachineFacts) -> None:
        self.machine = machine
        self.machine_changed.emit(machine)

    def set_config(self, config: RunConfig) -> None:
        """Replace the config (already validated) and tell every page. A different model brings what an earlier
        inspection found about it (or None), so no page shows the details of the model it replaced."""
        model_changed = config.model.name_or_path != self.config.model.name_or_path
        self.config = config
        self.settings.set_config(config)
        self.config_changed.emit(config)
        if model_changed:
            self.model_info = self._cached_model_info(config.model.name_or_path)
            self.model_info_changed.emit(self.model_info)

    def update(self, *assignments: str) -> None:
        """Apply `section.key=value` assignments (the same syntax as `hone train --set`)."""
        self.set_config(self.config.with_overrides(list(assignments)))

    def set_model(self, name_or_path: str, info: Any | None) -> None:
        """The user chose a model and it could be read; `info` is its ModelInfo."""
        config = dataclasses.replace(
            self.config, model=dataclasses.replace(self.config.model, name_or_path=name_or_path)
        )
        self.set_config(config)
        self.settings.add_recent_model(name_or_path)
        self.set_model_info(name_or_path, info)

    def set_model_info(self, name_or_path: str, info: Any | None) -> None:
        as_dict = dataclasses.asdict(info) if dataclasses.is_dataclass(info) else info
        if as_dict is not None:
            self.settings.set_value(f"model/info/{_key(name_or_path)}", json.dumps(as_dict))
        self.model_info = as_dict
        self.model_info_changed.emit(as_dict)

    def _cached_model_info(self, name_or_path: str) -> dict[str, Any] | None:
        """What an earlier inspection found (so the window shows it at start without loading torch)."""
        text = self.settings.value(f"model/info/{_key(name_or_path)}", "")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return None

    @property
    def is_moe(self) -> bool | None:
        """Whether the chosen model is a mixture of experts; None while unknown."""
        return None if self.model_info is None else bool(self.model_info.get("is_moe"))


def _key(name: str) -> str:
    # QSettings treats '/' as a group separator; keep the whole name as one key
    return name.replace("/", "|").replace("\\", "|")

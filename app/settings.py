"""What the Studio remembers between sessions (QSettings): last model and recents, data files, the run config,
runs folder, theme, window geometry and page, and whether the Train page shows its Basic or Advanced form."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QStandardPaths

from hone.core.config import RunConfig
from hone.core.errors import ConfigError

ORGANIZATION = "Hone"
APPLICATION = "Hone Studio"
MAX_RECENT_MODELS = 10
TRAIN_FORMS = ("basic", "advanced")  # the Train page's form: a new user starts with Basic


class Settings:
    """Typed access to the Studio's QSettings."""

    def __init__(self, qsettings: QSettings | None = None):
        self._s = qsettings or QSettings(ORGANIZATION, APPLICATION)

    # ---- model ----
    def recent_models(self) -> list[str]:
        return _str_list(self._s.value("model/recent", []))

    def add_recent_model(self, name: str) -> None:
        recent = [name] + [m for m in self.recent_models() if m != name]
        self._s.setValue("model/recent", recent[:MAX_RECENT_MODELS])

    # ---- run config (model and data choices live in it too) ----
    def config(self) -> RunConfig:
        """The last config the user edited; a fresh default (with the runs folder in the user's documents) when
        there is none or it no longer validates (a field was renamed by an update)."""
        text = self._s.value("config/toml", "")
        if text:
            try:
                import tomllib
            except ModuleNotFoundError:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            try:
                return RunConfig.from_dict(tomllib.loads(str(text)), source="saved settings")
            except (ConfigError, tomllib.TOMLDecodeError):
                pass
        config = RunConfig()
        config.output.runs_dir = str(default_runs_dir())
        return config

    def set_config(self, config: RunConfig) -> None:
        from hone.core.config import to_toml

        self._s.setValue("config/toml", to_toml(config.to_dict()))

    # ---- window ----
    def geometry(self) -> QByteArray | None:
        value = self._s.value("window/geometry")
        return value if isinstance(value, QByteArray) else None

    def set_geometry(self, value: QByteArray) -> None:
        self._s.setValue("window/geometry", value)

    def page(self) -> str:
        return str(self._s.value("window/page", ""))

    def set_page(self, name: str) -> None:
        self._s.setValue("window/page", name)

    def theme(self) -> str:
        return str(self._s.value("window/theme", "system"))

    def set_theme(self, mode: str) -> None:
        self._s.setValue("window/theme", mode)

    def train_form(self) -> str:
        value = str(self._s.value("train/form", TRAIN_FORMS[0]))
        return value if value in TRAIN_FORMS else TRAIN_FORMS[0]

    def set_train_form(self, form: str) -> None:
        if form not in TRAIN_FORMS:
            raise ValueError(f"the Train page's form is one of {', '.join(TRAIN_FORMS)}, not {form!r}")
        self._s.setValue("train/form", form)

    # ---- anything else (a page's own choices) ----
    def value(self, key: str, default: str = "") -> str:
        value = self._s.value(key, default)
        return default if value is None else str(value)

    def set_value(self, key: str, value: str) -> None:
        self._s.setValue(key, value)

    def list_value(self, key: str) -> list[str]:
        return _str_list(self._s.value(key, []))

    def set_list_value(self, key: str, values: list[str]) -> None:
        self._s.setValue(key, list(values))

    def sync(self) -> None:
        self._s.sync()


def default_runs_dir() -> Path:
    documents = QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation) or str(Path.home())
    return Path(documents) / "Hone Studio" / "runs"


def _str_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # QSettings' INI backend returns a one-item list as a plain string
        return [value] if value else []
    return [str(v) for v in value]

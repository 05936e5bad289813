"""Light and dark themes that follow the system, the stylesheet, chart colours and tinted icons."""

from __future__ import annotations

import os
import string
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

from hone.core.resources import resource_path

SYSTEM, LIGHT, DARK = "system", "light", "dark"


@dataclass(frozen=True)
class Palette:
    """Every colour the stylesheet and the charts use, as #rrggbb."""

    bg: str
    sidebar: str
    surface: str
    surface_alt: str
    input: str
    border: str
    hover: str
    scroll: str
    text: str
    muted: str
    accent: str
    accent_hover: str
    accent_soft: str
    accent_text: str
    success: str
    warning: str
    danger: str
    # chart series
    loss: str
    smooth: str
    eval: str
    speed: str
    mem_alloc: str
    mem_reserved: str
    mem_device: str
    lr: str
    util: str
    grid: str

    @property
    def is_dark(self) -> bool:
        return QColor(self.bg).lightness() < 128


DARK_PALETTE = Palette(
    bg="#0f1116",
    sidebar="#0b0d11",
    surface="#161920",
    surface_alt="#1c2029",
    input="#12151b",
    border="#272c37",
    hover="#1f2430",
    scroll="#353b48",
    text="#e7e9ef",
    muted="#8f98a8",
    accent="#7567ff",
    accent_hover="#8678ff",
    accent_soft="#262447",
    accent_text="#b9b1ff",
    success="#34d399",
    warning="#fbbf24",
    danger="#f87171",
    loss="#8b7fff",
    smooth="#f5a524",
    eval="#34d399",
    speed="#22d3ee",
    mem_alloc="#f472b6",
    mem_reserved="#fb923c",
    mem_device="#a78bfa",
    lr="#2dd4bf",
    util="#60a5fa",
    grid="#2a2f3a",
)

LIGHT_PALETTE = Palette(
    bg="#f6f7fb",
    sidebar="#eef0f6",
    surface="#ffffff",
    surface_alt="#f1f3f8",
    input="#ffffff",
    border="#e1e4ec",
    hover="#e8ebf3",
    scroll="#c9cfdb",
    text="#1a1e27",
    muted="#5f6878",
    accent="#5b4cf0",
    accent_hover="#4d3fe0",
    accent_soft="#e7e4ff",
    accent_text="#4335c9",
    success="#059669",
    warning="#b45309",
    danger="#dc2626",
    loss="#5b4cf0",
    smooth="#e08a00",
    eval="#059669",
    speed="#0891b2",
    mem_alloc="#db2777",
    mem_reserved="#ea580c",
    mem_device="#7c3aed",
    lr="#0d9488",
    util="#2563eb",
    grid="#e6e8ef",
)


class Theme(QObject):
    """The active palette. `mode` is system, light or dark; `changed` fires when the colours change (the user
    picked another mode, or the system switched while in system mode)."""

    changed = Signal(object)  # Palette

    @classmethod
    def shared(cls, mode: str = SYSTEM) -> Theme:
        """The application's one Theme (a stylesheet set on the whole application is costly to replace, so every
        window shares it); `mode` applies only when it is created."""
        app = QApplication.instance()
        theme = app.property("hone_theme")
        if not isinstance(theme, Theme):
            theme = cls(app, mode)
            app.setProperty("hone_theme", theme)
        return theme

    def __init__(self, app: QApplication, mode: str = SYSTEM):
        super().__init__(app)
        self._app = app
        self._mode = mode
        self.palette = self._resolve()
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):  # Qt 6.5+
            hints.colorSchemeChanged.connect(self._system_changed)
        self.apply()

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> None:
        if mode not in (SYSTEM, LIGHT, DARK):
            raise ValueError(f"theme mode {mode!r} is not one of system, light, dark")
        self._mode = mode
        self.palette = self._resolve()
        self.apply()

    def apply(self) -> None:
        """Set the Qt palette, the stylesheet and pyqtgraph's defaults, then tell listeners."""
        p = self.palette
        qt_palette = QPalette()
        roles = {
            QPalette.Window: p.bg,
            QPalette.Base: p.input,
            QPalette.AlternateBase: p.surface_alt,
            QPalette.Text: p.text,
            QPalette.WindowText: p.text,
            QPalette.Button: p.surface,
            QPalette.ButtonText: p.text,
            QPalette.Highlight: p.accent,
            QPalette.HighlightedText: "#ffffff",
            QPalette.ToolTipBase: p.surface_alt,
            QPalette.ToolTipText: p.text,
            QPalette.PlaceholderText: p.muted,
            QPalette.Link: p.accent,
        }
        for role, colour in roles.items():
            qt_palette.setColor(role, QColor(colour))
        qt_palette.setColor(QPalette.Disabled, QPalette.Text, QColor(p.muted))
        qt_palette.setColor(QPalette.Disabled, QPalette.ButtonText, QColor(p.muted))
        self._app.setPalette(qt_palette)
        self._app.setStyleSheet(stylesheet(p))
        import pyqtgraph as pg

        pg.setConfigOptions(background=p.surface, foreground=p.muted, antialias=True)
        self.changed.emit(p)

    def _resolve(self) -> Palette:
        if self._mode == LIGHT:
            return LIGHT_PALETTE
        if self._mode == DARK:
            return DARK_PALETTE
        return DARK_PALETTE if system_prefers_dark() else LIGHT_PALETTE

    def _system_changed(self, *_):
        if self._mode == SYSTEM:
            self.palette = self._resolve()
            self.apply()


def system_prefers_dark() -> bool:
    """What the desktop asks for; when it does not say (Qt < 6.5, offscreen), judge the default window colour."""
    hints = QGuiApplication.styleHints()
    scheme = getattr(hints, "colorScheme", lambda: None)()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return QGuiApplication.palette().color(QPalette.Window).lightness() < 128


# Focus rings, after studio.qss so they win over its state rules: a control that has keyboard focus gets a 2 px ring
# in the accent colour (on accent-filled buttons, in the text colour). Each rule takes one pixel off the padding the
# border adds, so focusing never changes a control's size and the layout never jumps.
FOCUS_RULES = """
/* ---- keyboard focus (hone.app.theme.FOCUS_RULES) ---- */
QPushButton:focus, QToolButton:focus {
    border: 2px solid $accent;
    padding: 5px 13px;
}
QPushButton[role="primary"]:focus {
    border: 2px solid $text;
}
QPushButton[role="preset"]:focus {
    padding: 5px 15px;
}
QLineEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus, QComboBox:focus {
    border: 2px solid $accent;
    padding: 4px 7px;
}
QLineEdit[invalid="true"]:focus, QSpinBox[invalid="true"]:focus, QDoubleSpinBox[invalid="true"]:focus,
QComboBox[invalid="true"]:focus {
    border: 2px solid $danger;
}
QPlainTextEdit:focus, QTextEdit:focus, QTextBrowser:focus, QListWidget:focus, QListView:focus, QTreeView:focus,
QTableWidget:focus, QTableView:focus {
    border: 2px solid $accent;
}
QCheckBox:focus, QRadioButton:focus {
    color: $accent_text;
}
QCheckBox::indicator:focus, QRadioButton::indicator:focus {
    border: 2px solid $accent;
}
QRadioButton::indicator:checked:focus {
    border: 5px solid $accent_text;
}
QSlider:focus {
    border: 1px solid $accent;
    border-radius: 4px;
}
QTabBar::tab:selected:focus {
    color: $accent_text;
    border-bottom: 2px solid $accent_text;
    background: $accent_soft;
}
QListWidget#Nav::item:focus {
    border: 2px solid $accent;
    padding: 7px 8px;
}
"""


def stylesheet(palette: Palette) -> str:
    template = string.Template(resource_path("styles/studio.qss").read_text(encoding="utf-8") + FOCUS_RULES)
    values = {f.name: getattr(palette, f.name) for f in fields(palette)}
    values["checkmark"] = icon_file("checkmark", "#ffffff")
    values["chevron"] = icon_file("chevron-down", palette.muted)
    return template.substitute(values)


def icon_file(name: str, colour: str) -> str:
    """Path of resources/icons/NAME.svg drawn in `colour`, for stylesheets (which take files, not QIcons).
    Written once per colour to the user's temp folder."""
    folder = Path(tempfile.gettempdir()) / "hone-studio-icons"
    path = folder / f"{name}-{colour.lstrip('#')}.svg"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        svg = resource_path(f"icons/{name}.svg").read_text(encoding="utf-8").replace("currentColor", colour)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(svg, encoding="utf-8")
        os.replace(tmp, path)  # atomic: two windows starting at once never read half a file
    return path.as_posix()


_icon_cache: dict[tuple[str, str, int], QIcon] = {}


def icon(name: str, colour: str, size: int = 20) -> QIcon:
    """An icon from resources/icons/NAME.svg with its strokes drawn in `colour` (crisp on HiDPI screens)."""
    key = (name, colour, size)
    if key not in _icon_cache:
        svg = resource_path(f"icons/{name}.svg").read_text(encoding="utf-8").replace("currentColor", colour)
        renderer = QSvgRenderer(QByteArray(svg.encode()))
        result = QIcon()
        for scale in (1, 2):
            pixmap = QPixmap(size * scale, size * scale)
            pixmap.fill(Qt.transparent)
            painter = QPainter(pixmap)
            renderer.render(painter, QRectF(0, 0, size * scale, size * scale))
            painter.end()
            pixmap.setDevicePixelRatio(scale)
            result.addPixmap(pixmap)
        _icon_cache[key] = result
    return _icon_cache[key]


def logo_pixmap(size: int) -> QPixmap:
    renderer = QSvgRenderer(str(resource_path("icons/logo.svg")))
    pixmap = QPixmap(size * 2, size * 2)
    pixmap.fill(Qt.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size * 2, size * 2))
    painter.end()
    pixmap.setDevicePixelRatio(2)
    return pixmap

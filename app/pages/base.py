"""What every sidebar page shares: a header, a scrollable body, and hooks for theme changes and visits."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from hone.app.state import AppState
from hone.app.theme import Palette
from hone.app.widgets.common import PageHeader


class Page(QWidget):
    """A sidebar page. Subclasses set `name` (used by --page and settings), `title`, `subtitle`, `icon_name`
    and fill `self.body`."""

    name = ""
    title = ""
    subtitle = ""
    icon_name = ""
    scrollable = True

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.palette_: Palette | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        content = QWidget()
        content.setObjectName("PageArea")
        layout = QVBoxLayout(content)
        layout.setContentsMargins(28, 24, 28, 24)
        layout.setSpacing(16)
        self.header = PageHeader(self.title, self.subtitle)
        layout.addWidget(self.header)
        self.body = QVBoxLayout()
        self.body.setSpacing(14)
        layout.addLayout(self.body, 1)
        if self.scrollable:
            scroll = QScrollArea()
            scroll.setWidgetResizable(True)
            scroll.setFrameShape(QFrame.NoFrame)
            scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
            scroll.setWidget(content)
            outer.addWidget(scroll)
        else:
            outer.addWidget(content)

    def apply_palette(self, palette: Palette) -> None:
        """Restyle what the stylesheet cannot reach (charts, icons); called at start and on theme changes."""
        self.palette_ = palette

    def shown(self) -> None:
        """The user opened this page."""

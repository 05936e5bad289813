"""Small building blocks every page uses: page headers, cards, stat tiles, key/value grids, styled roles."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)


def set_role(widget: QWidget, role: str) -> QWidget:
    """Style a widget by its `role` property (primary/danger buttons, muted/error labels, ...)."""
    widget.setProperty("role", role)
    widget.style().unpolish(widget)
    widget.style().polish(widget)
    return widget


def set_invalid(widget: QWidget, invalid: bool) -> None:
    if bool(widget.property("invalid")) != invalid:
        widget.setProperty("invalid", invalid)
        widget.style().unpolish(widget)
        widget.style().polish(widget)


def label(text: str = "", role: str | None = None, *, wrap: bool = False, selectable: bool = False) -> QLabel:
    widget = QLabel(text)
    if role:
        set_role(widget, role)
    widget.setWordWrap(wrap)
    if selectable:
        widget.setTextInteractionFlags(Qt.TextSelectableByMouse)
    return widget


class PageHeader(QWidget):
    """Title, one-line subtitle and room for actions on the right."""

    def __init__(self, title: str, subtitle: str, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        text = QVBoxLayout()
        text.setSpacing(2)
        self.title = QLabel(title)
        self.title.setObjectName("PageTitle")
        self.subtitle = QLabel(subtitle)
        self.subtitle.setObjectName("PageSubtitle")
        self.subtitle.setWordWrap(True)
        text.addWidget(self.title)
        text.addWidget(self.subtitle)
        layout.addLayout(text, 1)
        self.actions = QHBoxLayout()
        self.actions.setSpacing(8)
        layout.addLayout(self.actions)


class Columns(QWidget):
    """Widgets side by side while the width allows each its minimum, else one under another (the window's
    minimum width must not cut off what the right-hand column holds).

    The widget asks only for the width of its widest child, so an enclosing scroll area can make it narrower
    than the side-by-side layout needs; it then re-lays its children in one column.
    """

    def __init__(
        self, columns: int = 2, spacing: int = 14, stretches: tuple[int, ...] = (), parent: QWidget | None = None
    ):
        super().__init__(parent)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setSpacing(spacing)
        self._grid.setSizeConstraint(QLayout.SetNoConstraint)  # the minimum width is ours, see minimumSizeHint
        self._columns = columns
        self._stretches = stretches or (1,) * columns
        self._widgets: list[QWidget] = []
        self._shown_columns = 0

    def add(self, widget: QWidget) -> None:
        self._widgets.append(widget)
        self._arrange(self._columns, force=True)

    def columns(self) -> int:
        return self._shown_columns

    def minimumSizeHint(self) -> QSize:
        width = max((w.minimumSizeHint().width() for w in self._widgets), default=0)
        return QSize(width, self._grid.minimumSize().height())

    def sizeHint(self) -> QSize:
        return QSize(self.minimumSizeHint().width(), self._grid.sizeHint().height())

    def hasHeightForWidth(self) -> bool:
        return False

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._arrange(self._fitting_columns(event.size().width()))

    def _fitting_columns(self, width: int) -> int:
        rows = [self._widgets[i : i + self._columns] for i in range(0, len(self._widgets), self._columns)]
        needed = max(
            (sum(w.minimumSizeHint().width() for w in row) + self._grid.spacing() * (len(row) - 1) for row in rows),
            default=0,
        )
        return self._columns if needed <= width else 1

    def _arrange(self, columns: int, force: bool = False) -> None:
        if columns == self._shown_columns and not force:
            return
        self._shown_columns = columns
        for widget in self._widgets:
            self._grid.removeWidget(widget)
        for i, widget in enumerate(self._widgets):
            self._grid.addWidget(widget, i // columns, i % columns, Qt.AlignTop)
        for column in range(self._columns):
            self._grid.setColumnStretch(column, self._stretches[column] if column < columns else 0)
        self.updateGeometry()


class Card(QFrame):
    """A rounded panel with an optional title; put content in `body`."""

    def __init__(self, title: str = "", subtitle: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Card")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(16, 14, 16, 16)
        outer.setSpacing(10)
        self.header = QHBoxLayout()
        self.header.setSpacing(8)
        if title:
            heading = QVBoxLayout()
            heading.setSpacing(1)
            self.title = QLabel(title)
            self.title.setObjectName("SectionTitle")
            heading.addWidget(self.title)
            if subtitle:
                heading.addWidget(label(subtitle, "muted", wrap=True))
            self.header.addLayout(heading, 1)
            outer.addLayout(self.header)
        self.body = QVBoxLayout()
        self.body.setSpacing(8)
        outer.addLayout(self.body, 1)


class StatTile(QFrame):
    """A number people glance at: small caps label, big value, a detail line."""

    def __init__(self, title: str, value: str = "—", detail: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Card")
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        layout.setSpacing(2)
        self._title = QLabel(title.upper())
        self._title.setObjectName("StatLabel")
        self._value = QLabel(value)
        self._value.setObjectName("StatValue")
        self._value.setWordWrap(True)  # a long value (a model's name) takes two lines rather than widen the page
        self._detail = QLabel(detail)
        self._detail.setObjectName("StatDetail")
        for widget in (self._title, self._value, self._detail):
            layout.addWidget(widget)

    def set_title(self, title: str) -> None:
        self._title.setText(title.upper())

    def title(self) -> str:
        return self._title.text()

    def set(self, value: str, detail: str | None = None) -> None:
        self._value.setText(value)
        if detail is not None:
            self._detail.setText(detail)

    def value(self) -> str:
        return self._value.text()

    def detail(self) -> str:
        return self._detail.text()


class InfoGrid(QWidget):
    """Key/value pairs in two aligned columns (per column pair), updated in place."""

    def __init__(self, keys: list[str], columns: int = 2, parent: QWidget | None = None):
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(8)
        self._values: dict[str, QLabel] = {}
        rows = (len(keys) + columns - 1) // columns
        for i, key in enumerate(keys):
            row, col = i % rows, (i // rows) * 2
            key_label = QLabel(key)
            key_label.setObjectName("InfoKey")
            value = QLabel("—")
            value.setObjectName("InfoValue")
            value.setTextInteractionFlags(Qt.TextSelectableByMouse)
            grid.addWidget(key_label, row, col)
            grid.addWidget(value, row, col + 1)
            self._values[key] = value
        for col in range(columns):
            grid.setColumnStretch(col * 2 + 1, 1)

    def set(self, key: str, value: str) -> None:
        self._values[key].setText(value)

    def value(self, key: str) -> str:
        return self._values[key].text()

    def clear(self) -> None:
        for value in self._values.values():
            value.setText("—")


def human_bytes(n: float) -> str:
    """Bytes in binary units, named as such: 8 * 2**30 -> "8.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit in ("GiB", "TiB") else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_count(n: float) -> str:
    """1234 -> 1.2K, 135_000_000 -> 135M, 8.03e9 -> 8.0B."""
    for value, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= value:
            scaled = n / value
            return f"{scaled:.1f}{suffix}" if scaled < 100 else f"{scaled:.0f}{suffix}"
    return f"{n:.0f}"


def human_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"

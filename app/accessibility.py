"""Keyboard use and screen readers: page shortcuts, accessible names, and a Tab order that follows the screen.

Nothing here is page-specific. Names come from what a control already says (its text, the label beside or above it,
its placeholder, its tooltip, the card it sits in), so a page gets them without code of its own; the Tab order is
the order a reader scans the screen (top to bottom, then left to right, one panel at a time). Both are applied when
a page is built and again whenever it is shown, because pages add controls as they fill.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from itertools import pairwise

from PySide6.QtCore import QEvent, QObject, QRect, Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractScrollArea,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QBoxLayout,
    QComboBox,
    QDialog,
    QFormLayout,
    QGridLayout,
    QHeaderView,
    QLabel,
    QLayout,
    QLineEdit,
    QPlainTextEdit,
    QScrollBar,
    QStackedWidget,
    QTabBar,
    QTableWidget,
    QTabWidget,
    QTextEdit,
    QWidget,
)
from shiboken6 import isValid

__all__ = [
    "INTERACTIVE",
    "KeyboardAccess",
    "derive_name",
    "interactive_widgets",
    "name_widgets",
    "order_tabs",
    "prepare",
    "reading_order",
]

# What a user operates; each needs a name a screen reader can say and a place in the Tab order.
INTERACTIVE = (
    QAbstractButton,
    QLineEdit,
    QTextEdit,
    QPlainTextEdit,
    QAbstractSpinBox,
    QComboBox,
    QAbstractSlider,
    QAbstractItemView,
    QTabBar,
)
# Controls built of other controls (a spin box's line edit, a tab bar's scroll arrows, a view's header): the parts
# are the whole's business, not separate stops.
_COMPOSITE = (QComboBox, QAbstractSpinBox, QAbstractItemView, QTabBar, QLineEdit, QTextEdit, QPlainTextEdit)
AUTO_NAME = "hone_auto_name"  # dynamic property: the name this module gave, so it can be refreshed, never a user's
KEEPS_TAB = "hone_keeps_tab"  # dynamic property: a text box where Tab types a tab (none yet); others pass focus on
_LONGEST_NAME = 80  # characters: a screen reader's name is a label, not a paragraph


def interactive_widgets(root: QWidget) -> list[QWidget]:
    """The controls under `root` (and `root` itself) that a user operates, in creation order; parts of composite
    controls, scroll bars, headers and what belongs to another window (a dialog parented to a page) are left out."""
    window = root.window()
    found = []
    for widget in [root, *root.findChildren(QWidget)]:
        if not isinstance(widget, INTERACTIVE) or isinstance(widget, (QScrollBar, QHeaderView)):
            continue
        if widget.window() is not window or _inside_composite(widget, root):
            continue
        found.append(widget)
    return found


def _inside_composite(widget: QWidget, root: QWidget) -> bool:
    parent = widget.parentWidget()
    while parent is not None:  # through windows too: a combo box's popup list is a window of its own
        if isinstance(parent, _COMPOSITE):
            return True
        if parent is root:
            return False
        parent = parent.parentWidget()
    return False


def clean(text: str) -> str:
    """Text as a name: no markup, mnemonics (&), trailing colon or ellipsis; one line, at most _LONGEST_NAME."""
    text = re.sub(r"<[^>]+>", " ", text or "")
    text = re.sub(r"&(?!&)", "", text).replace("&&", "&")
    text = " ".join(text.split()).rstrip(":….").strip()
    if len(text) > _LONGEST_NAME:
        cut = text[:_LONGEST_NAME].rsplit(" ", 1)[0]
        text = cut if cut else text[:_LONGEST_NAME]
    return text


def _own_words(widget: QWidget) -> str:
    if isinstance(widget, QAbstractButton):
        return clean(widget.text())
    if isinstance(widget, QTabBar):
        tabs = [clean(widget.tabText(i)) for i in range(widget.count())]
        tabs = [t for t in tabs if t]
        return clean("Tabs: " + ", ".join(tabs)) if tabs else ""
    return ""


def _layout_of(widget: QWidget) -> QLayout | None:
    """The layout that places `widget` (possibly nested inside its parent's layout)."""
    parent = widget.parentWidget()
    top = parent.layout() if parent is not None else None
    if top is None:
        return None
    stack = [top]
    while stack:
        layout = stack.pop()
        for i in range(layout.count()):
            item = layout.itemAt(i)
            if item.widget() is widget:
                return layout
            if item.layout() is not None:
                stack.append(item.layout())
    return None


def _label_text(item, beside: bool = False) -> str:
    """The text of the QLabel in layout `item`. In a row or column of widgets (`beside`) the label just before a
    control names it unless it is a paragraph (wraps) or a value (selectable: a path, a status)."""
    widget = item.widget() if item is not None else None
    if not isinstance(widget, QLabel):
        return ""
    if beside and (widget.wordWrap() or widget.textInteractionFlags() & Qt.TextSelectableByMouse):
        return ""
    return clean(widget.text())


def _label_beside(widget: QWidget) -> str:
    """The text of the QLabel that names `widget` by position: its form row's label, the grid cell left of or
    above it, or the label just before it in a row or column of widgets. A control alone in a wrapper (a form
    field with its note below) takes the wrapper's label."""
    holder = widget
    for _ in range(3):
        text = _label_at(holder)
        parent = holder.parentWidget()
        if text or parent is None or parent.isWindow() or len(interactive_widgets(parent)) != 1:
            return text
        holder = parent
    return ""


def _label_at(widget: QWidget) -> str:
    layout = _layout_of(widget)
    if isinstance(layout, QFormLayout):
        label = layout.labelForField(widget)
        return clean(label.text()) if isinstance(label, QLabel) else ""
    if isinstance(layout, QGridLayout):
        index = layout.indexOf(widget)
        row, column, _rows, _columns = layout.getItemPosition(index)
        for r, c in ((row, column - 1), (row - 1, column)):
            if r >= 0 and c >= 0:
                text = _label_text(layout.itemAtPosition(r, c))
                if text:
                    return text
        return ""
    if isinstance(layout, QBoxLayout):
        across = layout.direction() in (QBoxLayout.LeftToRight, QBoxLayout.RightToLeft)
        if not across and isinstance(widget, QAbstractButton):
            return ""  # a label above a button heads what is above it; the button has words of its own
        index = layout.indexOf(widget)
        for i in range(index - 1, -1, -1):  # the nearest widget before it, skipping spacing and stretch
            item = layout.itemAt(i)
            if item.widget() is not None:
                return _label_text(item, beside=True)
    return ""


def _panel_title(widget: QWidget) -> str:
    """The title of the card (or other panel with a section title) that holds `widget`."""
    parent = widget.parentWidget()
    while parent is not None and not parent.isWindow():
        for title in parent.findChildren(QLabel, "SectionTitle", Qt.FindDirectChildrenOnly):
            if clean(title.text()):
                return clean(title.text())
        parent = parent.parentWidget()
    return ""


def _tab_title(widget: QWidget) -> str:
    """The title of the QTabWidget tab that shows `widget`."""
    child, parent = widget, widget.parentWidget()
    while parent is not None and not parent.isWindow():
        tabs = parent.parentWidget()
        if isinstance(tabs, QTabWidget) and parent is tabs.findChild(QStackedWidget, options=Qt.FindDirectChildrenOnly):
            index = tabs.indexOf(child)
            return clean(tabs.tabText(index)) if index >= 0 else ""
        child, parent = parent, parent.parentWidget()
    return ""


def _first_sentence(text: str) -> str:
    """A tooltip's first sentence, without the config key Hone puts on its last line."""
    first = (text or "").strip().split("\n\n")[0]
    return clean(re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0])


def _kind_words(widget: QWidget) -> str:
    """What a list or table holds, from its column headers."""
    if isinstance(widget, QTableWidget) and widget.columnCount():
        heads = [widget.horizontalHeaderItem(i) for i in range(min(widget.columnCount(), 4))]
        words = [clean(h.text()) for h in heads if h is not None and clean(h.text())]
        return clean("Table: " + ", ".join(words)) if words else ""
    return ""


def derive_name(widget: QWidget, buddies: dict[int, QLabel] | None = None) -> str:
    """A name for `widget` from the words already on screen for it, best first: its own text, the label whose buddy
    it is, the label beside or above it, its placeholder, its tooltip's first sentence, its tab's title, its table's
    headers, its panel's title."""
    label = (buddies or {}).get(id(widget))
    placeholder = widget.placeholderText() if hasattr(widget, "placeholderText") else ""
    sources: Iterable[Callable[[], str]] = (
        lambda: _own_words(widget),
        lambda: clean(label.text()) if label is not None else "",
        lambda: _label_beside(widget),
        lambda: clean(placeholder),
        lambda: _first_sentence(widget.toolTip()),
        lambda: _tab_title(widget),
        lambda: _kind_words(widget),
        lambda: _panel_title(widget),
        lambda: clean(re.sub(r"(?<=[a-z])(?=[A-Z])|_", " ", widget.objectName())),
    )
    for source in sources:
        text = source()
        if text:
            return text
    return ""


def _buddies(root: QWidget) -> dict[int, QLabel]:
    found = {}
    for label in root.window().findChildren(QLabel):
        buddy = label.buddy()
        if buddy is not None:
            found[id(buddy)] = label
    return found


def name_widgets(root: QWidget) -> list[QWidget]:
    """Give every control under `root` without a name one derived from the screen; refresh the names given earlier
    (a button's text changes). Returns the controls left without one."""
    buddies = _buddies(root)
    unnamed = []
    for widget in interactive_widgets(root):
        refresh_name(widget, buddies)
        if not widget.accessibleName():
            unnamed.append(widget)
    return unnamed


def refresh_name(widget: QWidget, buddies: dict[int, QLabel] | None = None) -> None:
    current = widget.accessibleName()
    if current and current != widget.property(AUTO_NAME):
        return  # set by the page itself: it knows better
    name = derive_name(widget, buddies)
    if name and name != current:
        widget.setAccessibleName(name)
        widget.setProperty(AUTO_NAME, name)


def pass_tab_on(root: QWidget) -> None:
    """Multi-line text boxes let Tab move to the next control (Qt's default types a tab there, trapping keyboard
    users); Ctrl+Tab still types one. A box that needs Tab sets the KEEPS_TAB property."""
    for edit in root.findChildren(QAbstractScrollArea):
        if isinstance(edit, (QPlainTextEdit, QTextEdit)) and not edit.property(KEEPS_TAB):
            edit.setTabChangesFocus(True)


def tab_through_button_groups(root: QWidget) -> None:
    """Keep each checkable button of a non-exclusive QButtonGroup (presets) a Tab stop of its own.

    As a grouped checkable button takes focus, Qt takes Tab focus from the group's other buttons
    (QAbstractButtonPrivate::fixFocusPolicy), as for radio buttons, where the arrow keys then move inside the group.
    In a non-exclusive group the arrow keys do not, so the keyboard could reach only the first button. An exclusive
    group stays one stop with arrow keys, as Qt has it.
    """
    for button in root.findChildren(QAbstractButton):
        group = button.group()
        if group is not None and not group.exclusive() and button.isCheckable():
            button.setFocusPolicy(button.focusPolicy() | Qt.TabFocus)


def _rect(widget: QWidget, root: QWidget) -> QRect:
    return QRect(widget.mapTo(root, widget.rect().topLeft()), widget.size())


def _cut(items: list, rect_of: Callable, horizontal: bool) -> list[list]:
    """Split `items` into bands along y (horizontal=True) or x, where their projections leave a gap."""
    ordered = sorted(items, key=lambda it: rect_of(it).top() if horizontal else rect_of(it).left())
    bands: list[list] = []
    end = None
    for item in ordered:
        r = rect_of(item)
        start, stop = (r.top(), r.bottom()) if horizontal else (r.left(), r.right())
        if end is None or start > end:
            bands.append([item])
            end = stop
        else:
            bands[-1].append(item)
            end = max(end, stop)
    return bands


def _xy_order(items: list, rect_of: Callable) -> list:
    """Reading order: bands top to bottom, inside a band columns left to right, recursively."""
    if len(items) <= 1:
        return list(items)
    rows = _cut(items, rect_of, horizontal=True)
    if len(rows) > 1:
        return [it for row in rows for it in _xy_order(row, rect_of)]
    columns = _cut(items, rect_of, horizontal=False)
    if len(columns) > 1:
        return [it for column in columns for it in _xy_order(column, rect_of)]
    return sorted(items, key=lambda it: (rect_of(it).top(), rect_of(it).left()))  # overlapping: by top-left


def reading_order(widgets: list[QWidget], root: QWidget) -> list[QWidget]:
    """`widgets` (visible under `root`) in the order a reader scans the screen: one panel at a time (a card, a column
    of controls), each panel's content top to bottom, then left to right."""
    wanted = {id(w) for w in widgets}

    def order_under(parent: QWidget, members: list[QWidget]) -> list[QWidget]:
        # group the members by the direct child of `parent` that holds them, order those groups on screen, recurse
        groups: dict[int, tuple[QWidget, list[QWidget]]] = {}
        for widget in members:
            child = widget
            while child.parentWidget() is not parent:
                child = child.parentWidget()
            groups.setdefault(id(child), (child, []))[1].append(widget)
        ordered = _xy_order(list(groups.values()), lambda group: _rect(group[0], root))
        result = []
        for child, inside in ordered:
            if id(child) in wanted:
                result.append(child)
            rest = [w for w in inside if w is not child]
            if rest:
                result += order_under(child, rest)
        return result

    return order_under(root, [w for w in widgets if w is not root]) if widgets else []


def tab_stops(root: QWidget) -> list[QWidget]:
    """The controls under `root` that Tab can stop at now: visible, enabled or not, with a Tab focus policy."""
    return [
        w
        for w in interactive_widgets(root)
        if w is not root and w.isVisibleTo(root) and w.focusPolicy() & Qt.TabFocus == Qt.TabFocus
    ]


def order_tabs(root: QWidget) -> list[QWidget]:
    """Set the Tab order of `root`'s visible controls to their reading order; returns that order."""
    order = reading_order(tab_stops(root), root)
    for first, second in pairwise(order):
        QWidget.setTabOrder(first, second)
    return order


def prepare(root: QWidget) -> list[QWidget]:
    """Names, Tab passing on, and screen-order Tab for `root` (a page or a dialog); returns the controls that still
    have no name."""
    if not isValid(root):
        return []
    unnamed = name_widgets(root)
    pass_tab_on(root)
    tab_through_button_groups(root)
    if root.isVisible():  # geometry means nothing before the first show
        order_tabs(root)
    return unnamed


class TabKeyOrder(QObject):
    """Event filter on the focused control: as Tab or Shift+Tab is pressed there, and before Qt moves the focus, the
    Tab order of the page (or Hone dialog) holding it is set to the screen's reading order again. A page that shows
    or hides controls while the user stays on it (a format's options, Basic and Advanced) never leaves Tab on an
    order laid out for controls that are no longer where they were."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window

    def root_of(self, widget: QWidget) -> QWidget | None:
        """The page of the main window, or the Hone dialog, that holds `widget`; None elsewhere."""
        pages = {id(self.window.stack.widget(i)) for i in range(self.window.stack.count())}
        while widget is not None:
            if id(widget) in pages or (isinstance(widget, QDialog) and type(widget).__module__.startswith("hone.")):
                return widget
            widget = widget.parentWidget()
        return None

    def eventFilter(self, watched, event) -> bool:
        if (
            event.type() == QEvent.KeyPress
            and event.key() in (Qt.Key_Tab, Qt.Key_Backtab)
            and not event.modifiers() & (Qt.ControlModifier | Qt.AltModifier)
            and isinstance(watched, QWidget)
        ):
            root = self.root_of(watched)
            if root is not None and root.isVisible():
                order_tabs(root)
        return False  # Qt moves the focus itself, along the order just set


class KeyboardAccess(QObject):
    """The main window's keyboard layer: Ctrl+1…N open the sidebar's pages in order, Ctrl+Q closes the window the
    usual way (asking first about a running run), and pages and dialogs are prepared (see `prepare`) when shown.

    Args:
        window: a MainWindow (has `nav`, the sidebar list, and `stack`, the pages).
    """

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.shortcuts: list[QShortcut] = []
        nav = window.nav
        nav.setAccessibleName("Pages")
        for row in range(nav.count()):
            keys = QKeySequence(f"Ctrl+{row + 1}")
            if row < 9:  # Ctrl+1…9 exist; more pages would go without
                self._shortcut(keys, lambda row=row: nav.setCurrentRow(row))
                item = nav.item(row)
                item.setToolTip(f"{item.text()} ({keys.toString(QKeySequence.NativeText)})")
        self._shortcut(QKeySequence("Ctrl+Q"), window.close)  # closeEvent asks about a running run
        window.theme_button.setAccessibleName(window.theme_button.toolTip() or "Theme")
        nav.currentRowChanged.connect(self._page_shown)  # after the window's own slot: the page is filled and shown
        window.installEventFilter(self)
        app = QApplication.instance()
        self._tab_key = TabKeyOrder(window)
        app.focusWindowChanged.connect(self._window_focused)
        app.focusChanged.connect(self._focus_changed)
        for row in range(window.stack.count()):
            prepare(window.stack.widget(row))

    def _shortcut(self, keys: QKeySequence, action: Callable) -> None:
        shortcut = QShortcut(keys, self.window)
        shortcut.activated.connect(action)
        self.shortcuts.append(shortcut)

    def _page_shown(self, _row: int = 0) -> None:
        page = self.window.stack.currentWidget()
        prepare(page)
        QTimer.singleShot(0, page, lambda: prepare(page))  # again once word-wrapped labels have settled their heights

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window and event.type() == QEvent.Show:  # geometry exists from the first show on
            QTimer.singleShot(0, self, self._page_shown)
        return False

    def _window_focused(self, handle) -> None:
        """A dialog of the Studio's came up (Search the Hub, a run's failure): prepare it like a page. Qt's own
        dialogs (files, messages) keep their own order."""
        if handle is None:
            return
        for widget in QApplication.topLevelWidgets():
            if (
                isinstance(widget, QDialog)
                and widget.windowHandle() is handle
                and type(widget).__module__.startswith("hone.")
            ):
                prepare(widget)

    def _focus_changed(self, old, new) -> None:
        if old is not None and isValid(old):
            old.removeEventFilter(self._tab_key)
        if new is None or not isValid(new):
            return
        new.installEventFilter(self._tab_key)  # one widget at a time: the one Tab is pressed in
        if new.property(AUTO_NAME):  # the name a screen reader says as focus arrives matches the control's text now
            refresh_name(new, _buddies(new))
        if isinstance(new, QAbstractButton) and new.group() is not None:  # Qt just took Tab focus from its group
            tab_through_button_groups(new.parentWidget() or new)

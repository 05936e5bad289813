"""Keyboard use (issue 43): Ctrl+1…N open the sidebar's pages, Ctrl+Q closes through the window's close path, a
focused control looks focused in every palette, and Tab reaches every control of every page in screen order."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from PySide6.QtCore import QEvent, QObject, QPoint, QRect, Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QHeaderView,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollBar,
    QTabBar,
    QTextEdit,
    QWidget,
)
from shiboken6 import isValid

from hone.app.theme import DARK, DARK_PALETTE, LIGHT, LIGHT_PALETTE, Palette, stylesheet
from hone.app.window import PAGE_CLASSES, PAGE_NAMES
from hone.core.api import MachineFacts
from hone.core.events import StepMetrics
from tests.app.test_window import _slow_trainer

CONTROLS = (
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
PARTS_OF = (QComboBox, QAbstractSpinBox, QAbstractItemView, QTabBar, QLineEdit, QTextEdit, QPlainTextEdit)


def settle(rounds: int = 4) -> None:
    for _ in range(rounds):
        QApplication.processEvents()


def controls(root: QWidget) -> list[QWidget]:
    """Every control a user operates under `root` in its window (not the parts of a composite control: a spin box's
    line edit, a tab bar's arrows; not scroll bars or headers)."""
    found = []
    for widget in root.findChildren(QWidget):
        if not isinstance(widget, CONTROLS) or isinstance(widget, (QScrollBar, QHeaderView)):
            continue
        if widget.window() is not root.window():
            continue
        parent, part = widget.parentWidget(), False
        while parent is not None and parent is not root:
            part = part or isinstance(parent, PARTS_OF)
            parent = parent.parentWidget()
        if not part:
            found.append(widget)
    return found


def activate(qtbot, window) -> None:
    """Make `window` the active window (offscreen, showing it is not enough), as shortcuts and focus need."""
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5000)


def describe(widget: QWidget) -> str:
    chain, parent = [], widget.parentWidget()
    while parent is not None and len(chain) < 6:
        chain.append(type(parent).__name__ + (f"#{parent.objectName()}" if parent.objectName() else ""))
        parent = parent.parentWidget()
    return f"{type(widget).__name__} objectName={widget.objectName()!r} in {' < '.join(chain)}"


# ---- shortcuts ----


def test_ctrl_number_opens_each_page_in_sidebar_order_and_tooltips_say_so(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    assert len(PAGE_NAMES) == 7
    for number, name in reversed(list(enumerate(PAGE_NAMES, start=1))):  # from the last, so each press changes page
        qtbot.keyClick(window, Qt.Key_0 + number, Qt.ControlModifier)
        assert window.current_page() == name, f"Ctrl+{number}"
        tooltip = window.nav.item(number - 1).toolTip()
        assert f"Ctrl+{number}" in tooltip and PAGE_CLASSES[number - 1].title in tooltip


class CloseSpy(QObject):
    def __init__(self):
        super().__init__()
        self.closes = 0

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Close:
            self.closes += 1
        return False


def test_ctrl_q_closes_the_window(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    spy = CloseSpy()
    window.installEventFilter(spy)
    qtbot.keyClick(window, Qt.Key_Q, Qt.ControlModifier)
    qtbot.waitUntil(lambda: not isValid(window) or not window.isVisible(), timeout=5000)
    assert spy.closes == 1


def test_ctrl_q_during_a_run_asks_first_like_closing_does(qtbot, make_window, monkeypatch):
    window = make_window(trainer=_slow_trainer, machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    events = []
    window.state.session.event.connect(events.append)
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: any(isinstance(e, StepMetrics) for e in events), timeout=10_000)
    asked = []
    monkeypatch.setattr(window, "ask_stop_on_close", lambda: asked.append(1) or QMessageBox.Cancel)
    qtbot.keyClick(window, Qt.Key_Q, Qt.ControlModifier)
    assert asked == [1], "Ctrl+Q went through closeEvent, which asked"
    assert window.isVisible() and window.state.session.is_running, "Cancel keeps the window and the run"


# ---- focus rings ----

FOCUS_TARGETS = {  # control type -> a selector that must carry a :focus rule
    "buttons": "QPushButton:focus",
    "line edits": "QLineEdit:focus",
    "spin boxes": "QSpinBox:focus",
    "combo boxes": "QComboBox:focus",
    "text boxes": "QPlainTextEdit:focus",
    "check boxes": "QCheckBox::indicator:focus",
    "radio buttons": "QRadioButton::indicator:focus",
    "lists": "QListWidget:focus",
    "tables": "QTableWidget:focus",
    "sidebar items": "QListWidget#Nav::item:focus",
}


def focus_rules(sheet: str) -> dict[str, str]:
    """selector -> declarations, for every selector of the stylesheet that names :focus (the last rule wins)."""
    rules = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", re.sub(r"/\*.*?\*/", "", sheet, flags=re.S)):
        for selector in selectors.split(","):
            if ":focus" in selector:
                rules[selector.strip()] = body
    return rules


@pytest.mark.parametrize("palette", [DARK_PALETTE, LIGHT_PALETTE], ids=["dark", "light"])
def test_the_stylesheet_rings_every_kind_of_focused_control_in_the_accent_colour(palette: Palette):
    assert {f.name for f in fields(Palette)} >= {"accent", "text"}
    rules = focus_rules(stylesheet(palette))
    for kind, selector in FOCUS_TARGETS.items():
        assert selector in rules, f"no focus style for {kind} ({selector})"
        border = re.search(r"border:\s*(\d+)px solid (#[0-9a-fA-F]{6})", rules[selector])
        assert border, f"the focus style of {kind} draws no border: {rules[selector]}"
        assert int(border.group(1)) >= 2 and border.group(2) == palette.accent, kind
    # on an accent-filled button an accent ring would not show: it is drawn in the text colour
    assert f"solid {palette.text}" in rules['QPushButton[role="primary"]:focus']


@pytest.mark.parametrize("mode", [DARK, LIGHT])
def test_a_focused_button_looks_different_and_keeps_its_size(qtbot, make_window, mode):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    before = window.theme.mode
    window.theme.set_mode(mode)
    try:
        window.show_page("runs")
        settle()
        page = window.page("runs")
        buttons = [b for b in page.findChildren(QPushButton) if b.isVisible() and b.isEnabled() and b.text()]
        assert len(buttons) >= 2
        button, other = buttons[0], buttons[1]
        other.setFocus(Qt.TabFocusReason)
        settle()
        assert not button.hasFocus()
        plain, size = button.grab().toImage(), button.size()
        button.setFocus(Qt.TabFocusReason)
        settle()
        assert button.hasFocus()
        focused = button.grab().toImage()
        assert button.size() == size, "focusing must not move the layout"
        changed = sum(
            focused.pixel(x, y) != plain.pixel(x, y) for x in range(plain.width()) for y in range(plain.height())
        )
        ring = {focused.pixelColor(x, 1).name() for x in range(plain.width() // 4, 3 * plain.width() // 4)}
        assert changed > plain.width(), f"only {changed} pixels changed on focus"
        assert window.theme.palette.accent in ring, f"the top edge is {ring}, not the accent colour"
    finally:
        window.theme.set_mode(before)


# ---- Tab ----


def tab_walk(qtbot, window, start: QWidget, limit: int) -> list[QWidget]:
    """Press Tab (a real key event to the focused widget, as a user does) from `start`, `limit` times at most or
    until the focus comes back to `start`; the focused widgets in order."""
    start.setFocus(Qt.TabFocusReason)
    settle(2)
    visited = []
    for _ in range(limit):
        focused = window.focusWidget()
        assert focused is not None
        qtbot.keyClick(focused, Qt.Key_Tab)
        now = window.focusWidget()
        if now is start:
            break
        visited.append(now)
    return visited


def owner(widget: QWidget, candidates: list[QWidget]) -> QWidget | None:
    """The control among `candidates` that `widget` is or belongs to (a spin box for its line edit)."""
    ids = {id(c): c for c in candidates}
    while widget is not None:
        if id(widget) in ids:
            return ids[id(widget)]
        widget = widget.parentWidget()
    return None


def reachable(widget: QWidget, window) -> bool:
    return widget.isVisibleTo(window) and widget.isEnabled() and widget.focusPolicy() & Qt.TabFocus == Qt.TabFocus


def group_of(widget: QWidget) -> list[QWidget]:
    """The buttons `widget` shares one Tab stop with: Qt makes a button group (or auto-exclusive radio buttons) one
    stop, and the arrow keys move inside it (QAbstractButtonPrivate::fixFocusPolicy / moveFocus)."""
    if isinstance(widget, QAbstractButton):
        if widget.group() is not None:
            return list(widget.group().buttons())
        if widget.autoExclusive() and widget.parentWidget() is not None:
            siblings = widget.parentWidget().findChildren(type(widget), options=Qt.FindDirectChildrenOnly)
            return [b for b in siblings if b.autoExclusive()]
    return [widget]


def arrow_walk(qtbot, window, start: QWidget, count: int) -> list[QWidget]:
    """From `start`, press Down (or Right, where Down goes nowhere) `count` times, then from `start` again Up (or
    Left); the focused widgets."""
    visited = [start]
    for keys in ((Qt.Key_Down, Qt.Key_Right), (Qt.Key_Up, Qt.Key_Left)):
        start.setFocus(Qt.TabFocusReason)
        for _ in range(count):
            for key in keys:
                before = window.focusWidget()
                qtbot.keyClick(before, key)
                if window.focusWidget() is not before:
                    break
            visited.append(window.focusWidget())
    return visited


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_tab_reaches_every_control_of_every_page(qtbot, make_window, name):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    window.show_page(name)
    settle()
    page = window.page(name)
    wanted = [w for w in controls(page) if reachable(w, window)]
    assert wanted, "a page with nothing to operate"
    walked = tab_walk(qtbot, window, window.nav, limit=4 * len(wanted) + 20)
    reached = {id(owner(w, wanted)) for w in walked}
    missed = []
    for widget in wanted:
        if id(widget) in reached:
            continue
        group = [b for b in group_of(widget) if b.isVisibleTo(window) and b.isEnabled()]
        stop = next((b for b in group if id(b) in reached), None)
        if stop is None:
            missed.append(describe(widget) + f" {getattr(widget, 'text', lambda: '')()!r}")
        else:  # its group's Tab stop was reached: the arrow keys must get from there to it
            assert widget in arrow_walk(qtbot, window, stop, 2 * len(group)), f"arrows never reach {widget.text()!r}"
    assert not missed, "Tab never reaches:\n" + "\n".join(missed)


def rows_then_columns(widgets: list[QWidget], root: QWidget) -> list[QWidget]:
    """The screen's reading order: rows top to bottom (a widget whose top is above the bottom of the row's first
    widget is in that row), each row left to right."""
    rect = {id(w): QRect(w.mapTo(root, QPoint(0, 0)), w.size()) for w in widgets}
    ordered = sorted(widgets, key=lambda w: (rect[id(w)].top(), rect[id(w)].left()))
    rows: list[list[QWidget]] = []
    for widget in ordered:
        if rows and rect[id(widget)].top() <= rect[id(rows[-1][0])].bottom():
            rows[-1].append(widget)
        else:
            rows.append([widget])
    return [w for row in rows for w in sorted(row, key=lambda w: rect[id(w)].left())]


def test_export_tab_order_follows_the_screen(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    window.show_page("export")
    settle()
    page = window.page("export")
    page.format_buttons["gguf"].click()  # its quantization types: a control shown between the formats and the folder
    assert page.type_box.isVisible()  # shown while the user stays on the page: the order follows as Tab is pressed
    settle()
    wanted = [w for w in controls(page) if reachable(w, window)]
    walked = tab_walk(qtbot, window, window.nav, limit=4 * len(wanted) + 20)

    def stops(widgets: list[QWidget]) -> list[str]:
        """One entry per Tab stop, a button group counting once (where its first button is)."""
        seen, result = set(), []
        for widget in widgets:
            key = id(group_of(widget)[0])
            if key not in seen:
                seen.add(key)
                result.append(describe(widget) + f" {getattr(widget, 'text', lambda: '')()!r}")
        return result

    order = stops([c for c in (owner(w, wanted) for w in walked) if c is not None])
    expected = stops(rows_then_columns(wanted, page))
    assert order == expected
    assert len(order) >= 7
    reached = [owner(w, wanted) for w in walked]
    assert reached.index(page.type_box) < reached.index(page.out_edit), "the format's type comes before the folder"


def test_tab_leaves_the_chat_prompt(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    activate(qtbot, window)
    window.show_page("chat")
    settle()
    prompts = [w for w in controls(window.page("chat")) if isinstance(w, QPlainTextEdit) and not w.isReadOnly()]
    assert len(prompts) == 1
    prompt = prompts[0]
    prompt.setFocus(Qt.TabFocusReason)
    qtbot.keyClicks(prompt, "hello")
    qtbot.keyClick(prompt, Qt.Key_Tab)
    assert window.focusWidget() is not prompt and prompt.toPlainText() == "hello", "Tab typed into the prompt"

"""At the window's own minimum size (980×640) every visible button of every page is whole: as wide as its text
needs and inside the area that shows it. Checked on widget geometry, not pixels."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QAbstractButton, QAbstractScrollArea, QApplication, QScrollArea

from hone.app.window import PAGE_NAMES
from hone.core.api import MachineFacts


def _visible_area(widget, window) -> QRect:
    """The part of the window where `widget` can be seen: the viewport of the scroll area it sits in (whose
    horizontal scroll bar is off, so what is cut at its sides cannot be reached), else the window."""
    parent = widget.parentWidget()
    while parent is not None and parent is not window:
        if isinstance(parent, QAbstractScrollArea):
            viewport = parent.viewport()
            top_left = viewport.mapTo(window, QPoint(0, 0))
            area = QRect(top_left, viewport.size())
            # vertical scrolling reaches everything: judge only the sides
            return QRect(area.left(), -(10**6), area.width(), 2 * 10**6)
        parent = parent.parentWidget()
    return window.rect()


def clipped_buttons(window) -> list[str]:
    problems = []
    for area in window.findChildren(QScrollArea):
        content = area.widget()
        fixed_width = area.horizontalScrollBarPolicy() == Qt.ScrollBarAlwaysOff
        if (
            area.isVisibleTo(window)
            and content is not None
            and fixed_width
            and content.width() > area.viewport().width()
        ):
            problems.append(
                f"the page is {content.width()} px wide in a {area.viewport().width()} px view: its right "
                "side is cut off"
            )
    for button in window.findChildren(QAbstractButton):
        if not button.isVisibleTo(window) or button.window() is not window:
            continue
        rect = QRect(button.mapTo(window, QPoint(0, 0)), button.size())
        name = button.text() or button.objectName() or type(button).__name__
        if not _visible_area(button, window).contains(rect):
            problems.append(f"{name!r} at {rect.getRect()} is cut off")
        elif button.text() and button.width() < button.minimumSizeHint().width():
            problems.append(f"{name!r} is {button.width()} px wide, its text needs {button.minimumSizeHint().width()}")
    return problems


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_no_button_is_cut_off_at_the_minimum_size(make_window, page):
    window = make_window(machine=MachineFacts(gpu=""))
    window.resize(980, 640)
    window.show_page(page)
    for _ in range(3):
        QApplication.processEvents()
    assert window.size().width() == 980
    assert clipped_buttons(window) == []

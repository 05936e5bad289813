"""Widgets of the Chat page: a side's transcript, and a run picker that shortens long names with "…"."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QComboBox, QLabel, QStyle, QStyleOptionComboBox, QStylePainter, QTextBrowser, QWidget


class Transcript(QTextBrowser):
    """One side's conversation; replies grow token by token at the end."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        # low enough for both sides, the run picker and the prompt to fit a 640-pixel-high window; taller ones grow
        self.setMinimumHeight(110)
        self.accent = "#7567ff"
        # What an empty pane says to do; a label over the viewport, as Qt's placeholder text does not wrap.
        self.empty_note = QLabel(self.viewport())
        self.empty_note.setWordWrap(True)
        self.empty_note.setProperty("role", "muted")
        self.empty_note.setAlignment(Qt.AlignLeft | Qt.AlignTop)
        self.document().contentsChanged.connect(self._show_empty_note)

    def set_empty_text(self, text: str) -> None:
        self.empty_note.setText(text)
        self._show_empty_note()

    def empty_text(self) -> str:
        """What the pane says while it holds no conversation ("" once it holds one)."""
        return self.empty_note.text() if self.document().isEmpty() else ""

    def _show_empty_note(self) -> None:
        self.empty_note.setVisible(self.document().isEmpty() and bool(self.empty_note.text()))

    def resizeEvent(self, event) -> None:  # Qt's name
        super().resizeEvent(event)
        margin = 8
        width = max(1, self.viewport().width() - 2 * margin)
        self.empty_note.setGeometry(margin, margin, width, self.empty_note.heightForWidth(width))

    def add_user(self, text: str) -> None:
        cursor = self._end()
        if not self.document().isEmpty():
            cursor.insertBlock()
        cursor.insertHtml(f"<p style='margin-top:10px'><b style='color:{self.accent}'>You</b></p>")
        cursor.insertBlock()
        cursor.insertText(text, QTextCharFormat())
        cursor.insertBlock()
        cursor.insertHtml("<p style='margin-top:8px'><b>Assistant</b></p>")
        cursor.insertBlock()
        self.ensureCursorVisible()

    def add_piece(self, text: str) -> None:
        # a plain format, not the cursor's: the cursor carries the bold of the heading inserted just before
        self._end().insertText(text, QTextCharFormat())
        self.ensureCursorVisible()

    def _end(self) -> QTextCursor:
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.End)
        self.setTextCursor(cursor)
        return cursor


class ElidedComboBox(QComboBox):
    """A combo box that shows a long choice with "…" in the middle where its width cuts it (Qt's own combo box cuts
    the text off at the edge); the whole name is its tooltip."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(16)  # room for a run name's start and end around the "…"
        self.currentTextChanged.connect(self.setToolTip)

    def shown_text(self) -> str:
        """The text as painted: the current choice, elided to the box's text area."""
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        area = self.style().subControlRect(QStyle.CC_ComboBox, option, QStyle.SC_ComboBoxEditField, self)
        return self.fontMetrics().elidedText(self.currentText(), Qt.ElideMiddle, area.width())

    def paintEvent(self, event) -> None:  # Qt's name
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.CC_ComboBox, option)
        option.currentText = self.shown_text()
        painter.drawControl(QStyle.CE_ComboBoxLabel, option)

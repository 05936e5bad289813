"""The Studio's tests never wait on a modal dialog: under the offscreen platform nobody can click it, and one such
wait once held the whole suite until CI's time limit. conftest.py's guard fails the test with the dialog's words."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox


def test_a_static_dialog_fails_the_test_with_its_words(qtbot):
    with pytest.raises(AssertionError, match=r"QMessageBox.warning.*Train more steps / the run folder is gone"):
        QMessageBox.warning(None, "Train more steps", "the run folder is gone")
    with pytest.raises(AssertionError, match=r"QInputDialog.getInt"):
        QInputDialog.getInt(None, "Train more steps", "How many?", 2, 1, 10)
    with pytest.raises(AssertionError, match=r"QFileDialog.getExistingDirectory"):
        QFileDialog.getExistingDirectory(None, "Model folder")


def test_a_dialogs_own_exec_fails_the_test_with_its_title_and_text(qtbot):
    box = QMessageBox(QMessageBox.Question, "A run is still training", "Keep it training?", QMessageBox.Cancel)
    qtbot.addWidget(box)
    with pytest.raises(AssertionError, match=r"QMessageBox.exec.*A run is still training / Keep it training"):
        box.exec()


def test_a_test_that_expects_a_dialog_replaces_it(qtbot, monkeypatch):
    monkeypatch.setattr(QMessageBox, "question", lambda *_a, **_k: QMessageBox.Yes)
    assert QMessageBox.question(None, "Delete run", "Delete it?") == QMessageBox.Yes

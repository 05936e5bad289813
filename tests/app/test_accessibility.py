"""Screen readers (issue 43): every control on every page and in the dialogs a user opens has an accessible name,
taken from the words already on screen for it; names follow a button's text; a control a page adds later is named
when the page is shown again; the Push to the Hub dialog fits the window at its minimum size."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from hone.app.accessibility import clean, name_widgets
from hone.app.window import PAGE_NAMES
from hone.core.api import MachineFacts
from tests.app.test_keyboard import controls, describe, settle
from tests.helpers.fake_hub import use_fake_hub


def unnamed(root: QWidget) -> list[str]:
    return [describe(w) for w in controls(root) if not w.accessibleName().strip()]


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_every_control_on_every_page_has_a_name(qtbot, make_window, name):
    window = make_window(machine=MachineFacts(gpu=""))
    window.show_page(name)
    settle()
    page = window.page(name)
    assert len(controls(page)) >= 3
    missing = unnamed(page)
    assert not missing, "no accessible name:\n" + "\n".join(missing)
    # a hint is not a name: a placeholder ("Ask something…") or a tooltip's instruction read out as what the
    # control is tells a screen reader's user what to type, not which field they are in
    hints = []
    for widget in controls(page):
        said = widget.accessibleName()
        placeholder = widget.placeholderText() if hasattr(widget, "placeholderText") else ""
        if said and (said == clean(placeholder) or said == clean(widget.toolTip().split(". ")[0])):
            hints.append(f"{describe(widget)} {said!r}")
    assert not hints, "named after its hint:\n" + "\n".join(hints)


def test_the_sidebar_is_named(make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    sidebar = window.nav.parentWidget()
    assert window.nav.accessibleName() == "Pages"
    assert not unnamed(sidebar)


def test_a_control_a_page_adds_later_is_named_when_the_page_is_shown(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    window.show_page("runs")
    settle()
    page = window.page("runs")
    row = QHBoxLayout()
    row.addWidget(QLabel("Learning rate"))
    added = QSpinBox()
    row.addWidget(added)
    search = QLineEdit()
    search.setPlaceholderText("Filter runs by name")
    row.addWidget(search)
    page.body.addLayout(row)
    window.show_page("export")
    window.show_page("runs")
    settle()
    assert added.accessibleName() == "Learning rate"
    assert search.accessibleName() == "Filter runs by name"


def test_names_come_from_the_words_on_screen(qtbot):
    root = QWidget()
    qtbot.addWidget(root)
    outer = QVBoxLayout(root)
    form = QFormLayout()
    rank = QSpinBox()
    form.addRow(QLabel("LoRA rank:"), rank)
    outer.addLayout(form)
    grid = QGridLayout()
    grid.addWidget(QLabel("Seed"), 0, 0)
    seed = QSpinBox()
    grid.addWidget(seed, 0, 1)
    grid.addWidget(QLabel("Optimizer"), 1, 0)
    optimizer_head = QLabel("Schedule")
    grid.addWidget(optimizer_head, 2, 2)
    schedule = QComboBox()
    grid.addWidget(schedule, 3, 2)  # the label is above it
    outer.addLayout(grid)
    buddy_label = QLabel("&Run name")
    run_name = QLineEdit()
    buddy_label.setBuddy(run_name)
    outer.addWidget(run_name)
    outer.addWidget(buddy_label)  # a buddy names its control wherever it sits
    icon_only = QPushButton()
    icon_only.setToolTip("Open the runs folder. It holds one folder per run.")
    outer.addWidget(icon_only)
    chosen = QCheckBox()
    chosen.setAccessibleName("Pack rows (set by the page)")
    outer.addWidget(chosen)
    save = QPushButton("Save config…")
    outer.addWidget(save)

    assert name_widgets(root) == []
    assert rank.accessibleName() == "LoRA rank"
    assert seed.accessibleName() == "Seed"
    assert schedule.accessibleName() == "Schedule"
    assert run_name.accessibleName() == "Run name"
    assert icon_only.accessibleName() == "Open the runs folder"
    assert chosen.accessibleName() == "Pack rows (set by the page)", "a name the page set is kept"
    assert save.accessibleName() == "Save config"

    save.setText("Saved")
    name_widgets(root)
    assert save.accessibleName() == "Saved", "a derived name follows the button's text"


def test_the_name_is_fresh_when_focus_arrives(qtbot, make_window):
    window = make_window(machine=MachineFacts(gpu=""))
    qtbot.waitActive(window)
    window.show_page("runs")
    settle()
    button = next(b for b in window.page("runs").findChildren(QPushButton) if b.isVisible() and b.text())
    old = button.accessibleName()
    assert old
    button.setText("Look again")
    button.setFocus(Qt.TabFocusReason)
    settle()
    assert button.accessibleName() == "Look again"


@pytest.fixture
def hub(monkeypatch, tmp_path, request):
    hub = use_fake_hub(monkeypatch, tmp_path)  # nothing reaches the network; no token: the dialog says so
    request.addfinalizer(hub.stop)
    return hub


FOLDERS = {
    "spaces": "/home/someone/Documents/Hone Studio/runs/2026-12-05-17-30-qwen3-0.6b-lora/exports/gguf-q8_0",
    "no spaces": "/home/someone/hone-runs/2026-12-05-17-30-qwen3-0.6b-instruct-lora-r16-alpha32-lr2e-4/exports/gguf",
    "deep": "/mnt/" + "/".join(f"project_{i:02d}_fine_tuning_runs" for i in range(8)) + "/exports/gguf-q8_0",
}


def push_dialog(qtbot, window, folder: str = FOLDERS["spaces"]):
    from hone.app.widgets.push_dialog import PushDialog

    page = window.page("export")
    window.show_page("export")
    dialog = PushDialog(folder, "2026-12-05-17-30-qwen3-0.6b-instruct-lora-r16-alpha32-gguf-q8_0", page)
    dialog.open()
    qtbot.waitUntil(lambda: not dialog.user_task.is_running(), timeout=10_000)
    settle()
    return dialog


def test_every_control_in_the_dialogs_has_a_name(qtbot, make_window, hub):
    window = make_window(machine=MachineFacts(gpu=""))
    qtbot.waitActive(window)
    dialog = push_dialog(qtbot, window)
    assert len(controls(dialog)) >= 4
    assert not unnamed(dialog), "\n".join(unnamed(dialog))
    assert dialog.repo_edit.accessibleName() == "Repository (OWNER/NAME)"
    dialog.reject()

    hub_dialog = window.page("model").open_hub()
    qtbot.waitUntil(lambda: not unnamed(hub_dialog), timeout=5000)  # named as it comes up
    assert len(controls(hub_dialog)) >= 6
    assert hub_dialog.query.accessibleName().startswith("Part of a model's name")
    hub_dialog.close()


@pytest.mark.parametrize("folder", FOLDERS.values(), ids=FOLDERS.keys())
def test_the_push_dialog_fits_the_window_at_its_minimum_size(qtbot, make_window, hub, folder):
    window = make_window(machine=MachineFacts(gpu=""))
    window.resize(980, 640)
    settle()
    assert window.size().width() == 980 and window.size().height() == 640
    dialog = push_dialog(qtbot, window, folder)
    assert "has no token" in dialog.note.text(), "the longest note is shown"
    assert dialog.width() <= 980 and dialog.height() <= 640, dialog.size()
    area = dialog.rect()
    problems = []
    for child in dialog.findChildren(QWidget):
        if not child.isVisibleTo(dialog):
            continue
        rect = QRect(child.mapTo(dialog, QPoint(0, 0)), child.size())
        if not area.contains(rect):
            problems.append(f"{describe(child)} at {rect.getRect()} is outside the dialog {area.getRect()}")
        if isinstance(child, QLabel) and child.wordWrap() and child.height() < child.heightForWidth(child.width()):
            problems.append(f"label {child.text()[:30]!r} is {child.height()} px high, its text needs more")
        if isinstance(child, (QPushButton, QLineEdit, QCheckBox)) and child.width() < child.minimumSizeHint().width():
            problems.append(f"{describe(child)} is narrower than it needs")
    assert not problems, "\n".join(problems)
    dialog.reject()

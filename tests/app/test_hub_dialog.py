"""Model page > Search the Hub…: a search shows the fake Hub's models, a download fills the bar, pause and resume
finish the file byte-exact, Use model makes the downloaded model the run's model, and errors show in the dialog."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import Qt

from tests.helpers.fake_hub import free_port, use_fake_hub

WEIGHTS = os.urandom(3 * 1024 * 1024 + 5)  # several chunks of hone.core.hub.download.CHUNK_BYTES


@pytest.fixture
def hub(monkeypatch, tmp_path, request):
    from hone.core.models.shapes import make_config

    hub = use_fake_hub(monkeypatch, tmp_path)
    request.addfinalizer(hub.stop)
    config = make_config("tiny-dense").to_json_string().encode()
    hub.add_model(
        "org/tiny-chat",
        {"config.json": config, "model.safetensors": WEIGHTS},
        downloads=42,
        license="apache-2.0",
        parameters={"BF16": 1_500_000},
    )
    hub.add_model("org/tiny-gated", {"config.json": config}, downloads=7, gated="manual", license="llama3")
    return hub


def _search(qtbot, dialog, text: str) -> None:
    """Type `text` in the search box, press Enter, wait for the answer."""
    qtbot.keyClicks(dialog.query, text)
    qtbot.keyClick(dialog.query, Qt.Key_Return)
    qtbot.waitUntil(lambda: not dialog.search_task.is_running(), timeout=10_000)


def _cell(dialog, row: int, column: str) -> str:
    from hone.app.widgets.hub_dialog import COLUMNS

    return dialog.table.item(row, COLUMNS.index(column)).text()


def test_search_download_and_use_a_model(qtbot, make_window, hub, tmp_path):
    from hone.app.widgets.hub_dialog import PROGRESS_STEPS

    window = make_window()
    page = window.page("model")
    dialog = page.open_hub()
    _search(qtbot, dialog, "tiny")
    assert dialog.table.rowCount() == 2
    assert _cell(dialog, 0, "Model") == "org/tiny-chat"  # most downloaded first
    assert _cell(dialog, 0, "Size") == "3 MiB · 1.5M" and _cell(dialog, 0, "License") == "apache-2.0"
    assert _cell(dialog, 0, "Gated") == "no" and _cell(dialog, 1, "Gated") == "yes (manual)"
    assert not dialog.use_button.isEnabled(), "nothing downloaded yet"

    dialog.table.selectRow(0)
    qtbot.waitUntil(lambda: dialog.fit_label.text().startswith("✓ org/tiny-chat fits"), timeout=30_000)
    dialog.download_button.click()
    qtbot.waitUntil(lambda: not dialog.is_downloading(), timeout=20_000)
    assert dialog.progress.value() == PROGRESS_STEPS
    assert "is downloaded" in dialog.status.text()
    snapshot = next((tmp_path / "hf-home" / "hub" / "models--org--tiny-chat" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS

    assert dialog.use_button.isEnabled()
    with qtbot.waitSignal(page.inspected, timeout=60_000):
        dialog.use_button.click()
    assert page.name_box.currentText() == "org/tiny-chat"
    assert window.state.config.model.name_or_path == "org/tiny-chat", page.status.text()
    assert page.params_tile.value() != "—", "the downloaded model's details were read from the cache"


def test_pause_keeps_what_arrived_and_resume_finishes_it(qtbot, make_window, hub, tmp_path, monkeypatch):
    from hone.core.hub import download

    monkeypatch.setattr(download, "REPORT_EVERY_S", 0.0)
    dialog = make_window().page("model").open_hub()
    dialog.fit_check = None
    _search(qtbot, dialog, "tiny-chat")
    dialog.table.selectRow(0)
    paused = []
    show_progress = dialog._progressed

    def pause_after_a_megabyte(p):  # the user presses Pause while the bytes arrive
        show_progress(p)
        if p.done > 1024 * 1024 and not paused:
            paused.append(p.done)
            dialog.pause_button.click()
            hub.release.set()  # the rest of the file comes only once Pause is pressed

    hub.hold_at = 3 * 1024 * 1024 // 2

    dialog._progressed = pause_after_a_megabyte
    dialog.download_button.click()
    qtbot.waitUntil(lambda: not dialog.is_downloading(), timeout=20_000)
    assert paused and "Paused at" in dialog.status.text() and dialog.pause_button.text() == "Resume"
    assert 0 < dialog.progress.value() < 1000
    dialog.pause_button.click()
    qtbot.waitUntil(lambda: not dialog.is_downloading(), timeout=20_000)
    assert dialog.progress.value() == 1000 and "is downloaded" in dialog.status.text()
    ranges = hub.ranges("model.safetensors")
    assert len(ranges) == 2 and ranges[0] == "" and ranges[1].startswith("bytes="), ranges
    snapshot = next((tmp_path / "hf-home" / "hub" / "models--org--tiny-chat" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_a_gated_model_and_an_unreachable_hub_are_explained_in_the_dialog(qtbot, make_window, hub, monkeypatch):
    dialog = make_window().page("model").open_hub()
    dialog.fit_check = None
    _search(qtbot, dialog, "gated")
    dialog.table.selectRow(0)
    dialog.download()
    qtbot.waitUntil(lambda: not dialog.is_downloading(), timeout=20_000)
    assert dialog.status.property("role") == "error"
    assert "is gated" in dialog.status.text() and "keyring" in dialog.status.text()
    assert not dialog.use_button.isEnabled()

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    dialog.query.clear()
    _search(qtbot, dialog, "tiny")
    assert "cannot be reached" in dialog.status.text() and dialog.status.property("role") == "error"

"""Export page > Push to the Hub…: enabled once the destination holds an export; the dialog suggests USER/RUN-FORMAT
from the Hub's whoami; the push lands the export byte-exact on the fake Hub and the page shows its URL; a token that
cannot write shows the Hub's refusal and what to do."""

from __future__ import annotations

import pytest

from hone.app.workers import TaskError
from tests.helpers.fake_hub import use_fake_hub

WRITE_TOKEN = "hf_write_token_alice"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run folder with a random LoRA on a tiny base (the export tests' own builders)."""
    from tests.core.export.export_helpers import tiny_dense_run

    return tiny_dense_run(tmp_path_factory.mktemp("export-push"))


@pytest.fixture
def hub(monkeypatch, tmp_path, request):
    hub = use_fake_hub(monkeypatch, tmp_path)
    request.addfinalizer(hub.stop)
    hub.add_user(WRITE_TOKEN, "alice")
    hub.add_user("hf_read_token", "alice", write=False)
    return hub


def _export(qtbot, page, run_dir, out) -> None:
    page.set_run(str(run_dir))
    page.format_buttons["adapter"].click()
    page.out_edit.setText(str(out))
    assert not page.push_button.isEnabled(), "nothing exported there yet"
    with qtbot.waitSignal(page.exported, timeout=60_000) as done:
        page.export_button.click()
    assert done.args[0].passed, done.args[0].failures
    qtbot.waitUntil(page.push_button.isEnabled, timeout=5000)


def _open_dialog(qtbot, page, expected_repo: str):
    dialog = page.open_push()
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: not dialog.user_task.is_running(), timeout=10_000)
    assert dialog.repo_edit.text() == expected_repo
    return dialog


def test_push_an_export_and_see_its_url(qtbot, window, tiny_run, hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    page = window.page("export")
    out = tmp_path / "adapter-export"
    _export(qtbot, page, tiny_run, out)

    dialog = _open_dialog(qtbot, page, "alice/my-run-adapter-export")
    assert "belongs to alice" in dialog.note.text()
    dialog.private_box.setChecked(False)
    with qtbot.waitSignal(page.pushed, timeout=20_000) as pushed:
        dialog.push_button.click()
    result = pushed.args[0]
    assert result.complete, result
    url = f"{hub.url}/alice/my-run-adapter-export"
    assert result.url == url and url in page.status.text() and result.commit[:12] in page.status.text()
    assert page.status.property("role") == "ok"
    files = hub.models["alice/my-run-adapter-export"].files
    assert not hub.models["alice/my-run-adapter-export"].private
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md"):
        assert files[name] == (out / name).read_bytes(), name
    qtbot.waitUntil(page.push_button.isEnabled, timeout=5000)  # ready for another push


def test_a_token_that_cannot_write_shows_the_refusal_and_advice(qtbot, window, tiny_run, hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_read_token")
    page = window.page("export")
    _export(qtbot, page, tiny_run, tmp_path / "adapter")
    dialog = _open_dialog(qtbot, page, "alice/my-run-adapter")
    with qtbot.waitSignal(page.pushed, timeout=20_000) as pushed:
        dialog.push_button.click()
    error = pushed.args[0]
    text = page.status.text()
    assert text.startswith("Push failed: the token from HF_TOKEN may not write to alice/my-run-adapter (403)")
    assert error.advice in text and "write access" in text and "hone models login" in text
    assert page.status.property("role") == "error" and not hub.commits


def test_without_a_token_the_dialog_asks_for_the_owner(qtbot, window, tiny_run, hub, tmp_path):
    page = window.page("export")
    _export(qtbot, page, tiny_run, tmp_path / "adapter")
    dialog = _open_dialog(qtbot, page, "my-run-adapter")
    assert "type your user name" in dialog.note.text()
    assert not dialog.push_button.isEnabled(), "no owner yet"
    dialog.repo_edit.clear()
    qtbot.keyClicks(dialog.repo_edit, "bob/my-run-adapter")
    assert dialog.push_button.isEnabled()
    with qtbot.waitSignal(page.pushed, timeout=20_000) as pushed:
        dialog.push_button.click()
    assert "Hone has no Hugging Face token" in page.status.text() and "HF_TOKEN" in page.status.text()
    assert isinstance(pushed.args[0], TaskError) and pushed.args[0].advice in page.status.text()

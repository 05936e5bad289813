"""`hone models search` and `hone models download` against a fake Hub (tests/helpers/fake_hub.py)."""

from __future__ import annotations

import os

import pytest

from hone.core.cli import main
from tests.helpers.fake_hub import free_port, use_fake_hub

WEIGHTS = os.urandom(1024 * 1024 + 77)


@pytest.fixture
def hub(monkeypatch, tmp_path, request):
    hub = use_fake_hub(monkeypatch, tmp_path)
    request.addfinalizer(hub.stop)
    hub.add_model(
        "org/tiny-chat",
        {"config.json": b"{}", "model.safetensors": WEIGHTS},
        downloads=1234,
        license="apache-2.0",
        parameters={"BF16": 2_500_000},
    )
    hub.add_model("org/tiny-gated", {"config.json": b"{}"}, gated="auto", license="llama3")
    return hub


def test_search_prints_a_row_per_model_with_size_license_and_gate(hub, capsys):
    assert main(["models", "search", "tiny", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    chat = next(line for line in out.splitlines() if "org/tiny-chat" in line)
    assert "2.5M" in chat and "5.0 MB" in chat and "1,234" in chat and "apache-2.0" in chat
    assert chat.split()[-1] == "no"
    gated = next(line for line in out.splitlines() if "org/tiny-gated" in line)
    assert "llama3" in gated and gated.split()[-1] == "auto"


def test_download_puts_the_model_in_the_cache_and_says_how_to_train_on_it(hub, tmp_path, capsys):
    assert main(["models", "download", "org/tiny-chat"]) == 0
    out = capsys.readouterr().out
    assert 'model.name_or_path = "org/tiny-chat"' in out and "done in" in out
    snapshot = next((tmp_path / "hf-home" / "hub" / "models--org--tiny-chat" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_errors_are_one_line_with_advice(hub, monkeypatch, capsys):
    assert main(["models", "download", "org/tiny-gated"]) == 2
    err = capsys.readouterr().err
    assert "hone: error: org/tiny-gated is gated" in err and "hone models login" in err
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert main(["models", "search", "tiny"]) == 2
    assert "cannot be reached" in capsys.readouterr().err


def test_login_keeps_the_token_in_the_keyring(hub, monkeypatch, capsys):
    import io

    import keyring

    from hone.core.hub.token import ACCOUNT, SERVICE

    monkeypatch.setattr("sys.stdin", io.StringIO("hf_secret\n"))
    assert main(["models", "login", "--token-stdin"]) == 0
    assert keyring.get_password(SERVICE, ACCOUNT) == "hf_secret"
    assert "hf_secret" not in capsys.readouterr().out
    assert main(["models", "logout"]) == 0
    assert keyring.get_password(SERVICE, ACCOUNT) is None

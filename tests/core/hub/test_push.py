"""hone.core.hub.push against the fake Hub on 127.0.0.1: a real adapter export of a tiny run lands byte-exact with
Hone's model card; a GGUF export without a card gets one; no token, a read token, another namespace, a closed port
and a folder that is no export are refused in words."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from tests.helpers.fake_hub import free_port, use_fake_hub

WRITE_TOKEN = "hf_write_token_alice"
READ_TOKEN = "hf_read_token_alice"


@pytest.fixture(scope="module")
def adapter_export(tmp_path_factory):
    """A tiny run's adapter exported by `export_run` (the export tests' own run builder)."""
    from hone.core.export import export_run
    from tests.core.export.export_helpers import tiny_dense_run

    run = tiny_dense_run(tmp_path_factory.mktemp("push"))
    result = export_run(run, "adapter")
    assert result.passed, result.failures
    return result.path


@pytest.fixture
def hub(monkeypatch, tmp_path, request):
    hub = use_fake_hub(monkeypatch, tmp_path)
    request.addfinalizer(hub.stop)
    hub.add_user(WRITE_TOKEN, "alice", orgs=("hone-org",))
    hub.add_user(READ_TOKEN, "alice", write=False)
    return hub


def test_an_adapter_export_lands_byte_exact_with_its_card(hub, adapter_export, monkeypatch):
    from hone.core.hub.push import PushProgress, push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    seen: list[PushProgress] = []
    result = push_folder(adapter_export, "alice/my-run-adapter", private=True, progress=seen.append)

    local = {p.name: p.read_bytes() for p in adapter_export.iterdir() if p.is_file()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "export.json"} <= set(local)
    pushed = hub.models["alice/my-run-adapter"]
    assert pushed.private
    assert set(pushed.files) == set(local) - {"export.json"}, "export.json names this machine's folders: kept home"
    for name in ("adapter_config.json", "adapter_model.safetensors", "README.md", "tokenizer.json"):
        assert hashlib.sha256(pushed.files[name]).digest() == hashlib.sha256(local[name]).digest(), name
    assert b"base_model:" in pushed.files["README.md"] and b"hone-studio" in pushed.files["README.md"]
    assert not result.card_written, "the adapter export carries its own card"

    assert result.complete and result.commit == pushed.sha == hub.commits[-1].oid
    assert result.url == f"{hub.url}/alice/my-run-adapter"
    assert result.commit_url == f"{hub.url}/alice/my-run-adapter/commit/{pushed.sha}"
    assert result.files == sorted(set(local) - {"export.json"})
    assert result.total_bytes == sum(len(local[n]) for n in result.files)
    assert len(hub.commits) == 1 and set(hub.commits[0].paths) == set(result.files), "one commit, every file"
    assert seen[0].stage == "creating alice/my-run-adapter" and seen[-1].stage == "done"
    assert seen[-1].done == seen[-1].total == result.total_bytes
    assert [p.file for p in seen if p.file] == result.files, "each file reported once, in order"
    sent = {h.get("authorization") for m, p, h in hub.requests if m == "POST"}
    assert sent == {f"Bearer {WRITE_TOKEN}"}


def test_pushing_again_to_an_existing_repo_commits_the_changed_file_only(hub, adapter_export, monkeypatch, tmp_path):
    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    copy = tmp_path / "adapter"
    shutil.copytree(adapter_export, copy)
    push_folder(copy, "hone-org/shared")  # an organization the token's user belongs to
    (copy / "README.md").write_text("# my own card\n", encoding="utf-8")
    again = push_folder(copy, "hone-org/shared")
    assert again.complete and hub.commits[-1].paths == ("README.md",), "unchanged files are not sent twice"
    assert hub.models["hone-org/shared"].files["README.md"] == b"# my own card\n"


def test_a_gguf_export_without_a_card_gets_hones(hub, monkeypatch, tmp_path):
    """export.json names the format, base and run; the card written from them goes up with the GGUF and Modelfile."""
    import json

    from hone.core.export.card import model_card
    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    folder = tmp_path / "exports" / "ollama-q4_0"
    folder.mkdir(parents=True)
    (folder / "my-run-q4_0.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (folder / "Modelfile").write_text("FROM ./my-run-q4_0.gguf\n", encoding="utf-8")
    (folder / "export.json").write_text(
        json.dumps({"format": "ollama:q4_0", "run": str(tmp_path / "runs" / "my-run"), "base_model": "org/tiny-base"}),
        encoding="utf-8",
    )
    result = push_folder(folder / "my-run-q4_0.gguf", "alice/my-run-gguf")  # the file stands for its folder
    expected = model_card("ollama:q4_0", "org/tiny-base", "my-run", "my-run-q4_0.gguf")
    assert result.card_written and (folder / "README.md").read_text(encoding="utf-8") == expected
    files = hub.models["alice/my-run-gguf"].files
    assert files == {
        "my-run-q4_0.gguf": (folder / "my-run-q4_0.gguf").read_bytes(),
        "Modelfile": b"FROM ./my-run-q4_0.gguf\n",
        "README.md": expected.encode(),
    }
    assert "ollama create my-run -f Modelfile" in expected and "base_model: org/tiny-base" in expected


def test_without_a_token_it_says_how_to_log_in_before_any_request(hub, adapter_export):
    from hone.core.hub.connection import HubError
    from hone.core.hub.push import push_folder

    with pytest.raises(HubError) as caught:
        push_folder(adapter_export, "alice/x")
    assert caught.value.code == "hub-token" and "no Hugging Face token" in caught.value.message
    assert "hone models login" in caught.value.advice and "HF_TOKEN" in caught.value.advice
    assert hub.requests == []


@pytest.mark.parametrize(
    ("token", "repo_id", "code", "words"),
    [
        (READ_TOKEN, "alice/x", "hub-write", "may not write to alice/x (403)"),
        (WRITE_TOKEN, "bob/x", "hub-write", "may not write to bob/x (403)"),
        ("hf_unknown", "alice/x", "hub-token", "did not accept the token from HF_TOKEN (401"),
    ],
)
def test_a_token_that_cannot_write_there_is_refused_in_words(
    hub, adapter_export, monkeypatch, token, repo_id, code, words
):
    from hone.core.hub.connection import HubError
    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(HubError) as caught:
        push_folder(adapter_export, repo_id)
    assert caught.value.code == code and words in caught.value.message
    assert "write" in caught.value.advice and "hone models login" in caught.value.advice
    assert not hub.commits and repo_id not in hub.models


def test_a_closed_port_gives_the_offline_message(hub, adapter_export, monkeypatch):
    from hone.core.hub.connection import HubError
    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HubError) as caught:
        push_folder(adapter_export, "alice/x")
    assert caught.value.code == "hub-offline" and "cannot be reached" in caught.value.message


def test_hf_hub_offline_and_bad_names_and_non_exports_are_refused_before_any_request(
    hub, adapter_export, monkeypatch, tmp_path
):
    from hone.core.hub.connection import HubError
    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x", encoding="utf-8")
    for folder, repo_id, words in (
        (tmp_path / "notes", "alice/x", "is not an export Hone made"),
        (tmp_path / "missing", "alice/x", "is not a folder"),
        (adapter_export, "my-adapter", "is not a repository name"),
        (adapter_export, "alice/bad name", "is not a repository name"),
    ):
        with pytest.raises(HubError, match=words):
            push_folder(folder, repo_id)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set"):
        push_folder(adapter_export, "alice/x")
    assert hub.requests == [] and not (tmp_path / "notes" / "README.md").exists()


def test_a_stop_before_the_commit_commits_nothing(hub, adapter_export, monkeypatch):
    import threading

    from hone.core.hub.push import push_folder

    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    stop = threading.Event()

    def progress(p):
        if p.file:
            stop.set()  # stop while the first file goes up

    result = push_folder(adapter_export, "alice/stopped", progress=progress, stop=stop)
    assert not result.complete and result.commit == ""
    assert hub.commits == [] and hub.models["alice/stopped"].files == {}, "the repo exists, empty"


def test_hub_user_is_the_tokens_account_or_empty(hub, monkeypatch):
    from hone.core.hub.push import hub_user

    assert hub_user() == ""
    monkeypatch.setenv("HF_TOKEN", READ_TOKEN)
    assert hub_user() == "alice"
    monkeypatch.setenv("HF_TOKEN", "hf_unknown")
    assert hub_user() == ""


def test_hone_push_prints_the_url_and_refuses_in_one_line(hub, adapter_export, monkeypatch, capsys):
    from hone.core.cli import main

    assert main(["push", str(adapter_export), "alice/cli-adapter"]) == 2, "no token yet"
    err = capsys.readouterr().err
    assert "hone: error: Hone has no Hugging Face token" in err and "hone models login" in err
    monkeypatch.setenv("HF_TOKEN", WRITE_TOKEN)
    assert main(["push", str(adapter_export), "alice/cli-adapter", "--private"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"{hub.url}/alice/cli-adapter", "stdout holds the URL alone"
    assert f"in commit {hub.models['alice/cli-adapter'].sha[:12]}" in err
    assert hub.models["alice/cli-adapter"].private
    assert (
        hub.models["alice/cli-adapter"].files["adapter_config.json"]
        == (adapter_export / "adapter_config.json").read_bytes()
    )

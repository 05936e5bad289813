"""hone.core.hub against a fake Hub on 127.0.0.1 (tests/helpers/fake_hub.py): search, a download into the
Hugging Face cache that transformers' loader finds, stop and resume, and the errors in words."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading

import pytest

from tests.helpers.fake_hub import MemoryKeyring, free_port, use_fake_hub

WEIGHTS = os.urandom(2 * 1024 * 1024 + 12345)  # three chunks of core.hub.download.CHUNK_BYTES
CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64}).encode()


@pytest.fixture
def keyring_store():
    return MemoryKeyring()


@pytest.fixture
def hub(monkeypatch, tmp_path, request, keyring_store):
    hub = use_fake_hub(monkeypatch, tmp_path, keyring_store)
    request.addfinalizer(hub.stop)
    hub.add_model(
        "org/tiny-chat",
        {
            "config.json": CONFIG,
            "model.safetensors": WEIGHTS,
            "pytorch_model.bin": b"pickled copy",
            "onnx/model.onnx": b"onnx copy",
            "README.md": b"# tiny",
        },
        downloads=500,
        likes=7,
        license="apache-2.0",
        parameters={"BF16": 1_000_000, "F32": 10},
    )
    hub.add_model("org/tiny-base", {"config.json": CONFIG}, downloads=9000, license="mit")
    hub.add_model("other/unrelated", {"config.json": CONFIG}, downloads=10**6)
    hub.add_model(
        "org/tiny-gated",
        {"config.json": CONFIG, "model.safetensors": b"secret weights"},
        gated="manual",
        license="llama3",
    )
    return hub


def test_search_lists_matches_most_downloaded_first_with_sizes_and_licenses(hub):
    from hone.core.hub.search import search_models

    found = search_models("TINY", limit=10)
    assert [m.id for m in found] == ["org/tiny-base", "org/tiny-chat", "org/tiny-gated"]
    chat = found[1]
    assert (chat.downloads, chat.likes, chat.license, chat.gated) == (500, 7, "apache-2.0", "")
    assert chat.parameters == 1_000_010
    assert chat.weight_bytes == 1_000_000 * 2 + 10 * 4  # bf16 and fp32 values
    assert found[0].weight_bytes is None, "no safetensors metadata: size unknown, not zero"
    assert found[2].is_gated and found[2].gated == "manual" and found[2].license == "llama3"
    assert [m.id for m in search_models("tiny", limit=1)] == ["org/tiny-base"]
    request = next(path for method, path, _ in hub.requests if path == "/api/models")
    assert request  # the search went to the fake Hub, the one endpoint


def test_an_empty_query_is_refused_before_any_request(hub):
    from hone.core.hub.connection import HubError
    from hone.core.hub.search import search_models

    with pytest.raises(HubError, match="type part of a model's name"):
        search_models("  ")
    assert hub.requests == []


def test_download_fills_the_hf_cache_byte_exact_and_loads_by_id(hub, tmp_path):
    from huggingface_hub import try_to_load_from_cache

    from hone.core.hub.download import download_model
    from hone.core.hub.search import model_files

    listing = model_files("org/tiny-chat")
    assert [f.name for f in listing.wanted] == ["config.json", "model.safetensors", "README.md"], (
        "the pickled and ONNX copies beside safetensors are not needed"
    )
    seen = []
    result = download_model("org/tiny-chat", progress=seen.append)
    total = len(CONFIG) + len(WEIGHTS) + len(b"# tiny")
    assert result.complete and result.done == result.total == total and result.files == 3
    assert seen[-1].done == seen[-1].total == total and seen[-1].files_done == 3
    assert all(a.done <= b.done for a, b in itertools.pairwise(seen)), "progress never goes back"
    cache = tmp_path / "hf-home" / "hub"
    for name, content in (("config.json", CONFIG), ("model.safetensors", WEIGHTS), ("README.md", b"# tiny")):
        found = try_to_load_from_cache("org/tiny-chat", name, cache_dir=cache)  # huggingface_hub's own lookup
        assert isinstance(found, str), name
        with open(found, "rb") as f:
            assert f.read() == content
    assert not isinstance(try_to_load_from_cache("org/tiny-chat", "pytorch_model.bin", cache_dir=cache), str)
    assert (cache / "models--org--tiny-chat" / "refs" / "main").read_text() == listing.commit


def test_stop_midway_keeps_the_part_and_the_next_download_resumes_with_a_range(hub, tmp_path, monkeypatch):
    from hone.core.hub import download
    from hone.core.hub.download import download_model

    monkeypatch.setattr(download, "REPORT_EVERY_S", 0.0)  # a report per chunk: loopback is faster than 10 Hz
    stop = threading.Event()

    def progress(p):
        if p.file == "model.safetensors" and p.done > len(CONFIG) + 1024 * 1024:
            stop.set()

    first = download_model("org/tiny-chat", progress=progress, stop=stop)
    assert not first.complete and 0 < first.done < first.total
    blobs = tmp_path / "hf-home" / "hub" / "models--org--tiny-chat" / "blobs"
    part = blobs / f"{hashlib.sha256(WEIGHTS).hexdigest()}.part"
    kept = part.stat().st_size
    assert 1024 * 1024 <= kept < len(WEIGHTS)

    second = download_model("org/tiny-chat")
    assert second.complete
    assert hub.ranges("model.safetensors") == ["", f"bytes={kept}-"], "the second GET asks only for the rest"
    assert (blobs / hashlib.sha256(WEIGHTS).hexdigest()).read_bytes() == WEIGHTS
    assert not part.exists()


def test_a_damaged_part_is_found_by_its_hash_and_removed(hub, tmp_path):
    from hone.core.hub.connection import HubError
    from hone.core.hub.download import download_model

    blobs = tmp_path / "hf-home" / "hub" / "models--org--tiny-chat" / "blobs"
    blobs.mkdir(parents=True)
    part = blobs / f"{hashlib.sha256(WEIGHTS).hexdigest()}.part"
    part.write_bytes(b"x" * 1000)  # not the file's first bytes: only the hash can tell
    with pytest.raises(HubError, match=r"arrived damaged.*sha256") as caught:
        download_model("org/tiny-chat")
    assert "download again" in caught.value.advice
    assert not part.exists()
    assert download_model("org/tiny-chat").complete


def test_a_gated_model_without_a_token_says_where_to_get_access(hub):
    from hone.core.hub.connection import HubError
    from hone.core.hub.download import download_model

    with pytest.raises(HubError) as caught:
        download_model("org/tiny-gated")
    error = caught.value
    assert error.code == "hub-gated" and "is gated" in error.message
    assert f"{hub.url}/org/tiny-gated" in error.advice and "keyring" in error.advice


def test_the_token_in_the_keyring_opens_a_gated_model_and_a_wrong_one_says_so(hub, keyring_store):
    from hone.core.hub.connection import HubError
    from hone.core.hub.download import download_model
    from hone.core.hub.token import ACCOUNT, SERVICE, hub_token, save_token

    save_token("hf_not_granted")
    with pytest.raises(HubError, match="not granted access"):
        download_model("org/tiny-gated")
    save_token(hub.token)
    assert keyring_store.entries == {(SERVICE, ACCOUNT): hub.token}
    assert hub_token() == (hub.token, "the OS keyring")
    assert download_model("org/tiny-gated").complete
    sent = [h.get("authorization") for m, p, h in hub.requests if "/resolve/" in p]
    assert sent[-1] == f"Bearer {hub.token}"


def test_without_a_keyring_the_token_is_refused_and_nothing_is_written(hub, monkeypatch, tmp_path):
    import keyring.core
    from keyring.backends import fail

    from hone.core.hub.connection import HubError
    from hone.core.hub.token import save_token

    monkeypatch.setattr(keyring.core, "_keyring_backend", fail.Keyring())
    with pytest.raises(HubError, match="no OS keyring") as caught:
        save_token("hf_abc")
    assert "HF_TOKEN" in caught.value.advice
    assert not any("hf_abc" in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())


def test_a_closed_port_gives_the_offline_message(hub, monkeypatch):
    from hone.core.hub.connection import HubError
    from hone.core.hub.download import download_model
    from hone.core.hub.search import search_models

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    for call in (lambda: search_models("tiny"), lambda: download_model("org/tiny-chat")):
        with pytest.raises(HubError) as caught:
            call()
        assert caught.value.code == "hub-offline" and "cannot be reached" in caught.value.message


def test_hf_hub_offline_is_said_before_any_request(hub, monkeypatch):
    from hone.core.hub.connection import HubError
    from hone.core.hub.search import search_models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set"):
        search_models("tiny")
    assert hub.requests == []


def test_unknown_model_and_revision(hub):
    from hone.core.hub.connection import HubError
    from hone.core.hub.download import download_model

    with pytest.raises(HubError, match="no model named 'org/nope'") as caught:
        download_model("org/nope")
    assert caught.value.code == "hub-not-found"
    with pytest.raises(HubError, match="no revision 'v9'"):
        download_model("org/tiny-chat", revision="v9")


def test_the_fit_verdict_comes_from_the_memory_planner_on_the_models_config(hub, tmp_path):
    """The planner's own prediction for the model's config decides; a gated model's config cannot be read."""
    from hone.core.config import RunConfig
    from hone.core.hub.machine_fit import fits_this_machine
    from hone.core.memory.estimate import GIB
    from hone.core.memory.run_plan import Memory, plan_run
    from hone.core.models.shapes import make_config

    config_json = make_config("tiny-dense").to_json_string().encode()
    hub.add_model("org/tiny-planned", {"config.json": config_json})
    run = RunConfig()
    roomy = fits_this_machine("org/tiny-planned", run, Memory(64 * GIB, "a test GPU"))
    assert roomy.fits is True and roomy.text.startswith("fits: a step needs") and "a test GPU" in roomy.text
    make_config("tiny-dense").save_pretrained(tmp_path / "local")
    expected = plan_run(run.with_overrides([f'model.name_or_path="{tmp_path / "local"}"']), Memory(64 * GIB, "x"))
    assert roomy.peak_bytes == pytest.approx(expected.estimate.peak_bytes)
    tight = fits_this_machine("org/tiny-planned", run, Memory(roomy.peak_bytes / 100, "a tiny GPU"))
    assert tight.fits is False and tight.text.startswith("does not fit")
    gated = fits_this_machine("org/tiny-gated", run, Memory(64 * GIB, "a test GPU"))
    assert gated.fits is None and "is gated" in gated.text

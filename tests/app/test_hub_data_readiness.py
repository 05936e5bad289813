"""A Hugging Face dataset id that cannot be had (no network, or offline mode) blocks Start on the Train page within
seconds, with the dataset, the reason and what to do on the form; datasets' own retries took half a minute."""

from __future__ import annotations

import json
import socket
import time

import pytest
from test_run_checks import GPU, _problems

NAME = "someorg/not-downloaded"


@pytest.fixture
def no_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache and a Hub address whose port is closed (connecting is refused at once)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for key in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    return port


def _show_again(window) -> None:
    """Leave the Train page and come back: it asks for the data's answer each time it is shown."""
    window.show_page("runs")
    window.show_page("train")


@pytest.mark.parametrize("offline", [False, True], ids=["hub unreachable", "offline mode"])
def test_a_hub_dataset_that_cannot_be_had_blocks_start_within_seconds(qtbot, make_window, no_hub, monkeypatch, offline):
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    window = make_window(machine=GPU)
    page = window.page("train")
    started = time.monotonic()
    window.state.update(f'data.train=["{NAME}"]')
    qtbot.waitUntil(lambda: not page.start_button.isEnabled() and not page.data_check_pending(), timeout=10_000)
    took = time.monotonic() - started
    assert took < 3.0, f"{took:.1f} s"
    text = _problems(page)
    assert NAME in text, text
    said = "offline mode is on" if offline else f"127.0.0.1:{no_hub}) cannot be reached"
    assert said in text and "onnect to the internet" in text and "local file" in text, text
    page.start()
    assert not window.state.session.is_running


def test_a_hub_dataset_is_checked_again_once_it_may_have_come(qtbot, make_window, no_hub, tmp_path, monkeypatch):
    """No file's modification time says that the network is back or the dataset was downloaded: a problem with a
    Hub id is checked again when the page asks, RECHECK_S after it was found."""
    import hone.app.data_readiness as readiness

    checks = []
    real = readiness.usable_rows_problems

    def counted(data_cfg, method):
        if data_cfg.train == [NAME]:
            checks.append(data_cfg)
        return real(data_cfg, method)

    monkeypatch.setattr(readiness, "usable_rows_problems", counted)
    window = make_window(machine=GPU)
    page = window.page("train")
    window.state.update(f'data.train=["{NAME}"]')
    qtbot.waitUntil(lambda: not page.start_button.isEnabled() and not page.data_check_pending(), timeout=10_000)
    assert NAME in _problems(page)

    repo = tmp_path / "hf" / "hub" / "datasets--someorg--not-downloaded"  # downloaded meanwhile (`hf download`)
    (repo / "snapshots" / "c0ffee" / "data").mkdir(parents=True)
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    (repo / "snapshots" / "c0ffee" / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    _show_again(window)
    qtbot.wait(300)
    assert len(checks) == 1 and NAME in _problems(page), "asked again within RECHECK_S: the answer stands"

    monkeypatch.setattr(readiness, "RECHECK_S", 0.0)
    _show_again(window)
    assert NAME in _problems(page) and not page.data_check_pending(), "the old answer shows until the new one comes"
    qtbot.waitUntil(lambda: page.start_button.isEnabled(), timeout=15_000)
    assert not _problems(page) and len(checks) == 2

"""A Hugging Face dataset id is known to be unavailable within seconds, not after datasets' half minute of retries:
offline mode, or a Hub that cannot be reached (a closed port, a name lookup that hangs), gives one error naming the
dataset and what to do; a dataset in the local cache (prepared by `datasets`, or downloaded as files) loads without
the Hub."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from hone.core.config import DataConfig
from hone.core.data import check_data, hub_datasets
from hone.core.data.loaders import SourceError, read_records, resolve_sources

NAME = "someorg/TinyChat"
ROWS = [
    {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
    for i in range(3)
]
# datasets' own retries took 24 s here for an id it could not reach; the bound leaves room for a slow test machine
WITHIN_S = 3.0


@pytest.fixture
def closed_port():
    """A port of 127.0.0.1 nothing listens on: connecting is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class Listener:
    """A socket listening on 127.0.0.1 that accepts nothing by itself: `accepted()` says whether a client connected."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]

    def accepted(self) -> bool:
        try:
            self.server.accept()[0].close()
        except BlockingIOError:
            return False
        return True


@pytest.fixture
def listening():
    listener = Listener()
    yield listener
    listener.server.close()


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face cache in tmp_path, online, no proxy: every setting the loader reads, set here."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    for key in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    return home


def _check(entry: str = NAME):
    started = time.monotonic()
    report, _ = check_data(DataConfig(train=[entry]), None, split="train")
    return report, time.monotonic() - started


def _prepare_in_cache(hf_home, tmp_path) -> None:
    """NAME as `datasets.load_dataset` leaves it in the cache after a download: Arrow files in
    HF_HOME/datasets/someorg___tiny_chat/default/0.0.0/HASH (written here by datasets' own JSON builder)."""
    from datasets.packaged_modules.json.json import Json

    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    build = tmp_path / "build"
    builder = Json(
        cache_dir=str(build),
        dataset_name="tiny_chat",
        data_files={"train": str(source)},
        hash="3f2a",
        config_id="default",
    )
    builder.download_and_prepare()
    (hf_home / "datasets").mkdir(parents=True)
    (build / "tiny_chat").rename(hf_home / "datasets" / "someorg___tiny_chat")


def _download_in_cache(hf_home) -> None:
    """NAME as `hf download --repo-type dataset` leaves it in the hub cache: its files under
    HF_HOME/hub/datasets--someorg--TinyChat/snapshots/COMMIT, refs/main naming the commit."""
    repo = hf_home / "hub" / "datasets--someorg--TinyChat"
    snapshot = repo / "snapshots" / "9b1c0d"
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "README.md").write_text("# TinyChat\n")
    (snapshot / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("9b1c0d")


def test_an_unreachable_hub_is_said_at_once_with_the_dataset_and_what_to_do(hf_home, closed_port, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    report, took = _check()
    assert took < WITHIN_S, f"{took:.1f} s"
    (problem,) = report.problems
    assert problem.startswith(
        f"the Hugging Face dataset {NAME} cannot be loaded: it is not in the local Hugging Face cache"
    ), problem
    assert f"127.0.0.1:{closed_port}) cannot be reached (connection refused)" in problem, problem
    assert "Connect to the internet" in problem and "local file" in problem, problem
    assert report.rows_kept == 0


def test_a_name_lookup_that_hangs_is_given_up_within_the_probe_time(hf_home, monkeypatch):
    """A dead DNS server holds getaddrinfo for minutes: the probe waits PROBE_TIMEOUT_S for it, not longer."""
    real = socket.getaddrinfo

    def hanging(host, *args, **kwargs):
        if host == "hub.invalid":
            time.sleep(10)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    report, took = _check()
    assert hub_datasets.PROBE_TIMEOUT_S <= took < WITHIN_S, f"{took:.1f} s"
    (problem,) = report.problems
    assert "(looking up hub.invalid took longer than 1.5 s)" in problem and NAME in problem, problem


@pytest.mark.parametrize("setting", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_mode_refuses_without_a_connection(hf_home, listening, monkeypatch, setting):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.port}")
    monkeypatch.setenv(setting, "1")
    report, took = _check()
    assert took < WITHIN_S
    (problem,) = report.problems
    assert NAME in problem and f"offline mode is on (the {setting} setting)" in problem, problem
    assert "Turn offline mode off" in problem, problem
    assert not listening.accepted(), "offline means not even a connection"


def test_hf_datasets_offline_off_overrides_hf_hub_offline(hf_home, monkeypatch):
    """As in `datasets`: HF_DATASETS_OFFLINE, when set, decides for datasets whatever HF_HUB_OFFLINE says."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_datasets.offline_setting() == "HF_HUB_OFFLINE"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert hub_datasets.offline_setting() == ""


@pytest.mark.parametrize("offline", [False, True], ids=["hub unreachable", "offline mode"])
@pytest.mark.parametrize("cached", ["prepared by datasets", "downloaded files"])
def test_a_cached_dataset_loads_without_the_hub(hf_home, tmp_path, closed_port, monkeypatch, offline, cached):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if cached == "prepared by datasets":
        _prepare_in_cache(hf_home, tmp_path)
    else:
        _download_in_cache(hf_home)
    (source,) = resolve_sources([NAME])
    assert [record for _, record in read_records(source)] == ROWS
    report, took = _check()
    assert (report.problems, report.rows_read, report.rows_kept) == ([], 3, 3)
    assert took < WITHIN_S


def test_a_split_the_cached_dataset_lacks_is_named(hf_home, tmp_path, closed_port, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    _prepare_in_cache(hf_home, tmp_path)
    (source,) = resolve_sources([f"{NAME}:test"])
    with pytest.raises(SourceError, match="has no split 'test'; it has train"):
        list(read_records(source))


def test_a_snapshot_without_data_files_is_not_a_copy(hf_home, closed_port, monkeypatch):
    """Only the dataset card came down (a download cut short): the dataset is not there, and the error says so."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    snapshot = hf_home / "hub" / "datasets--someorg--TinyChat" / "snapshots" / "9b1c0d"
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("# TinyChat\n")
    assert hub_datasets.downloaded_copy(NAME) is None
    report, _ = _check()
    assert "is not in the local Hugging Face cache" in report.problems[0], report.problems


def test_a_reachable_hub_is_asked_by_datasets(hf_home, listening, monkeypatch):
    """The probe only decides whether to ask: a Hub that answers gets the request, cached copy or not."""
    import datasets

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listening.port}")
    asked = []

    def load_dataset(name):
        asked.append(name)
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    (source,) = resolve_sources([NAME])
    assert [record for _, record in read_records(source)] == ROWS
    assert asked == [NAME] and listening.accepted()


def test_the_probe_goes_through_the_proxy_the_environment_sets(hf_home, closed_port, listening, monkeypatch):
    """Behind a proxy the Hub's own address may be closed to direct connections: the proxy is what must answer."""
    hub = "https://huggingface.co"
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{listening.port}")
    assert hub_datasets.probe(hub) == ""
    assert listening.accepted()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port}")
    said = hub_datasets.probe(hub)
    assert f"the proxy 127.0.0.1:{closed_port}" in said and "cannot be reached" in said, said
    monkeypatch.setenv("NO_PROXY", "example.org, .huggingface.co")  # names other hosts: the proxy is asked
    assert "the proxy" in hub_datasets.probe(f"https://127.0.0.1:{listening.port}")
    assert not listening.accepted()
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1:8080")  # names this one (ports aside): it goes direct
    assert hub_datasets.probe(f"https://127.0.0.1:{listening.port}") == ""
    assert listening.accepted(), "connected to the host itself"


@pytest.mark.parametrize("name", ["TinyChat", "tiny-chat", "OpenHermes2.5", "HTMLPages", "gsm8k", "MMLUPro", "A1B2Cd"])
def test_the_cache_folder_name_is_the_one_datasets_gives(name):
    from datasets.naming import camelcase_to_snakecase

    assert hub_datasets.snake_case(name) == camelcase_to_snakecase(name)


def test_a_refusal_does_not_import_datasets(hf_home, closed_port):
    """`import datasets` alone takes over a second: a dataset that cannot be had is refused without it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hone.core.data.hub_datasets import HubDatasetUnavailable, load_hub_dataset\n"
        "try:\n"
        f"    load_hub_dataset({NAME!r})\n"
        "except HubDatasetUnavailable as e:\n"
        "    print(e)\n"
        "print('datasets' in sys.modules)\n"
    )
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{closed_port}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
    assert NAME in out and out.strip().endswith("False"), out

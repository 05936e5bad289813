"""A Hugging Face dataset id, loaded or refused within seconds: from the Hub when it can be reached, else from the
local cache, else an error that names the dataset and says what to do.

`datasets.load_dataset` retries a Hub it cannot reach for about half a minute (five retries with back-off) before it
says so. So the Hub is asked first whether it can be reached at all: offline mode (HF_DATASETS_OFFLINE, else
HF_HUB_OFFLINE, as `datasets` reads them), then one TCP connection to its address (HF_ENDPOINT, else huggingface.co;
the proxy's address when HTTPS_PROXY or HTTP_PROXY applies) within PROBE_TIMEOUT_S, name lookup included, and no
HTTP request. When it cannot be reached, the dataset comes from the local Hugging Face cache:

    HF_DATASETS_CACHE (else HF_HOME/datasets)/OWNER___NAME/CONFIG/VERSION/HASH/   what load_dataset prepared (Arrow)
    HF_HUB_CACHE (else HF_HOME/hub)/datasets--OWNER--NAME/snapshots/COMMIT/        the repository's files (hf download)

Every setting is read when a call is made, so a test (or a user who changed them) gets what it set, as
hone.core.hub.connection does for models; written apart from it, since hone.core.data may not import hone.core.hub.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
# Seconds the reachability probe may take, name lookup and connection together: a TCP handshake across continents
# takes a few hundred milliseconds, so a link that works answers well within it, and a machine without one is told
# within 2 s (datasets' own retries take about half a minute).
PROBE_TIMEOUT_S = 1.5
_TRUE = {"1", "on", "yes", "true"}
# A commit hash or branch name as huggingface_hub writes them into refs/ (never a path).
_REF = re.compile(r"^[\w.-]{1,255}$")
# Files of a dataset repository that are not data: a snapshot holding only these has no rows to read.
_NOT_DATA = {"README.md", ".gitattributes"}
# datasets.naming's two patterns: a run of capitals before a capitalized word, a lower letter or digit before a capital.
_UPPER_UPPER = re.compile(r"([A-Z]+)([A-Z][a-z])")
_LOWER_UPPER = re.compile(r"([a-z\d])([A-Z])")


class HubDatasetUnavailable(Exception):
    """A Hugging Face dataset cannot be had now: the Hub cannot be reached (or offline mode is on) and the local
    cache does not hold it. The message names the dataset, says why and what to do."""


def load_hub_dataset(name: str):
    """The `datasets` DatasetDict (or Dataset) of the Hugging Face dataset `name` ("owner/name").

    From the Hub (`datasets.load_dataset`) when it can be reached; otherwise from the local cache, without a request.
    A refusal imports nothing heavy (`datasets` alone takes over a second to import).

    Raises:
        HubDatasetUnavailable: the Hub cannot be reached and the cache does not hold the dataset (said within
            about PROBE_TIMEOUT_S).
        Exception: whatever `datasets` raises for a dataset it cannot load (the caller words it).
    """
    why = hub_unreachable()
    prepared = downloaded = None
    if why:
        prepared = prepared_copy(name)
        downloaded = None if prepared else downloaded_copy(name)
        if prepared is None and downloaded is None:
            raise HubDatasetUnavailable(unavailable_message(name, why))
    import datasets

    if not why:
        return datasets.load_dataset(name)
    if prepared is not None:
        from datasets.packaged_modules.cache.cache import Cache

        # what load_dataset itself reads in offline mode, without flipping datasets' process-wide offline switch
        builder = Cache(
            cache_dir=str(datasets_cache_dir()),
            dataset_name=snake_case(name.partition("/")[2]),
            repo_id=name,
            version="auto",
            hash="auto",
        )
        return builder.as_dataset()
    # a folder of data files, read as any local folder is (no request); prepared into the datasets cache
    return datasets.load_dataset(str(downloaded), cache_dir=str(datasets_cache_dir()))


def hub_unreachable() -> str:
    """Why the Hub cannot be used now, in words ("" when it can): offline mode, or the probe's failure."""
    setting = offline_setting()
    if setting:
        return f"offline mode is on (the {setting} setting)"
    return probe(hub_endpoint())


def offline_setting() -> str:
    """The environment variable that switches the Hub off for `datasets`, or "": HF_DATASETS_OFFLINE when it is set
    at all (it overrides the other, as in `datasets`), else HF_HUB_OFFLINE."""
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        value = os.environ.get(key)
        if value is not None and value.strip():
            return key if value.strip().lower() in _TRUE else ""
    return ""


def hub_endpoint() -> str:
    """The Hub's address: HF_ENDPOINT when set (a mirror, a test server), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Whether a TCP connection to `url`'s host (or to the proxy that reaches it) opens within `timeout` seconds;
    "" when it does, else why not, in words that name the address. One try, no retries, nothing sent."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if not host:
        return f"the Hub address {url!r} names no host (check the HF_ENDPOINT setting)"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"the Hub address {url!r} has no valid port (check the HF_ENDPOINT setting)"
    target = f"the Hugging Face Hub ({url})"
    proxy = _proxy_for(parts.scheme, host)
    if proxy is not None:
        host, port = proxy
        target = f"the proxy {host}:{port} that leads to the Hugging Face Hub ({url})"
    deadline = time.monotonic() + timeout
    try:
        addresses = _lookup(host, port, timeout)
    except TimeoutError:
        return f"{target} cannot be reached (looking up {host} took longer than {timeout:g} s)"
    except OSError:
        return f"{target} cannot be reached (the name {host} cannot be looked up: no network?)"
    error: OSError | None = None
    for address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            socket.create_connection(address, timeout=left).close()
            return ""
        except OSError as e:
            error = e
    if error is None or isinstance(error, TimeoutError):
        return f"{target} cannot be reached (no answer within {timeout:g} s)"
    return f"{target} cannot be reached ({(error.strerror or type(error).__name__).lower()})"


def _proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    """(host, port) of the proxy the environment sets for `scheme` and `host` (as the Hub's HTTP client reads it), or
    None when connections go direct."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or _bypassed(host, proxies.get("no", "")):
        return None
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def _bypassed(host: str, no_proxy: str) -> bool:
    """Whether NO_PROXY ("*", or names and domains separated by commas, ports ignored) sends `host` direct."""
    host = host.lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        name = entry.split(":")[0].lstrip(".")
        if entry == "*" or (name and (host == name or host.endswith("." + name))):
            return True
    return False


def _lookup(host: str, port: int, seconds: float) -> list[tuple[str, int]]:
    """The addresses of `host`, looked up within `seconds`: the system resolver has no time limit of its own (a dead
    DNS server can hold it for minutes), so it runs on a daemon thread that is left behind if it does not answer.

    Raises:
        TimeoutError: no answer in time.
        OSError: the name cannot be looked up.
    """
    answer: dict = {}

    def lookup() -> None:
        try:
            answer["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            answer["error"] = e

    thread = threading.Thread(target=lookup, name=f"look up {host}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(host)
    if "error" in answer:
        raise answer["error"]
    return list(dict.fromkeys(info[4][:2] for info in answer["infos"]))


def datasets_cache_dir() -> Path:
    """Where `datasets` keeps the datasets it prepared: HF_DATASETS_CACHE, else HF_HOME/datasets (HF_HOME's default
    is the same for `datasets` and huggingface_hub: XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return _hf_home() / "datasets"


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded repositories: HF_HUB_CACHE, else HF_HOME/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    return _hf_home() / "hub"


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache).expanduser() / "huggingface"


def prepared_copy(name: str) -> Path | None:
    """The newest folder in which `datasets` prepared `name` (OWNER___NAME/CONFIG/VERSION/HASH, holding its
    dataset_info.json), or None."""
    owner, _, repo = name.partition("/")
    root = datasets_cache_dir() / f"{owner}___{snake_case(repo)}"
    try:
        found = [p for p in root.glob("*/*/*") if p.is_dir() and (p / "dataset_info.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def downloaded_copy(name: str) -> Path | None:
    """The snapshot folder of `name` in the hub cache (datasets--OWNER--NAME/snapshots/COMMIT) that refs/main
    points to, else the newest one, when it holds a data file; or None."""
    repo_dir = hub_cache_dir() / f"datasets--{name.replace('/', '--')}"
    snapshots = repo_dir / "snapshots"
    try:
        main = (repo_dir / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        main = ""
    try:
        candidates = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: -p.stat().st_mtime)
    except OSError:
        return None
    if _REF.match(main) and (snapshots / main).is_dir():
        candidates.insert(0, snapshots / main)
    return next((p for p in candidates if _holds_data(p)), None)


def _holds_data(snapshot: Path) -> bool:
    try:
        return any(p.is_file() and p.name not in _NOT_DATA for p in snapshot.rglob("*"))
    except OSError:
        return False


def unavailable_message(name: str, why: str) -> str:
    """The error for a dataset neither the Hub nor the cache can give: which one, why, and what to do."""
    if why.startswith("offline mode"):
        first = "Turn offline mode off and connect to the internet to download it once"
    else:
        first = "Connect to the internet and check again (it is downloaded once, then works offline)"
    return (
        f"the Hugging Face dataset {name} cannot be loaded: it is not in the local Hugging Face cache, and {why}, "
        f"so it cannot be downloaded. {first}, or give training data as a local file instead (JSONL, JSON, CSV, "
        "Parquet)"
    )


def snake_case(name: str) -> str:
    """The folder name `datasets` gives a dataset name ("TinyStories" -> "tiny_stories"): its
    naming.camelcase_to_snakecase, written again so a refusal need not import `datasets`."""
    name = _UPPER_UPPER.sub(r"\1_\2", name)
    return _LOWER_UPPER.sub(r"\1_\2", name).lower()

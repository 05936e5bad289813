"""Download a model from the Hub into the Hugging Face cache, with progress, a stop between chunks, and resume.

The files land where `from_pretrained(repo_id)` looks for them (the cache's documented layout:
`models--OWNER--NAME/blobs/ETAG`, `snapshots/COMMIT/FILE` linking to the blob, `refs/BRANCH` naming the commit), so
a downloaded model loads by its id with no network. Each file streams into `blobs/ETAG.part`; a stopped download
keeps that part and the next one asks the Hub for the rest (`Range: bytes=N-`). huggingface_hub's own
`hf_hub_download` is not used for the bytes because the releases Hone supports delete a partial file when a
download is interrupted, so a pause would start a 5 GB shard again. A finished file is checked against the size and
(for weights, whose ETag is their sha256) the hash the Hub gave before it is moved into place.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from hone.core.hub.connection import (
    TIMEOUT_S,
    HubError,
    cache_dir,
    check_online,
    endpoint,
    hub_errors,
    is_connection_problem,
    unreachable,
)
from hone.core.hub.search import HubFile, model_files
from hone.core.hub.token import hub_token

CHUNK_BYTES = 1024 * 1024  # read and checked for a stop this often: a pause takes effect within a megabyte
REPORT_EVERY_S = 0.1  # progress at most ~10 times a second (the studio redraws a bar per report)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class StopFlag(Protocol):
    """What `stop` may be: a threading.Event, or anything else with `is_set()`."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class DownloadProgress:
    """How far a download is. Bytes count every wanted file, those already in the cache included."""

    repo_id: str
    file: str
    done: int
    total: int
    files_done: int
    files_total: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


@dataclass(frozen=True)
class DownloadResult:
    """What a download left: `complete` False when it was stopped (start it again to resume)."""

    repo_id: str
    commit: str
    folder: str  # the snapshot folder (complete or not)
    complete: bool
    done: int
    total: int
    files: int


def download_model(
    repo_id: str,
    revision: str = "",
    *,
    progress: Callable[[DownloadProgress], None] | None = None,
    stop: StopFlag | None = None,
    all_files: bool = False,
) -> DownloadResult:
    """Download `repo_id` at `revision` (its main branch when "") into the Hugging Face cache.

    Args:
        repo_id: "owner/name".
        revision: a branch, tag or commit; "" for main.
        progress: called with a DownloadProgress as bytes arrive (at most every REPORT_EVERY_S, and at each file's
            end), on the caller's thread.
        stop: checked after every chunk; once set, the download returns with `complete` False and keeps what it
            has, so the next call resumes.
        all_files: every file of the repo, not only what transformers needs (`search.wanted_files`).

    Raises:
        HubError: offline, gated without access, no such model or revision, or a file that arrived damaged.
    """
    check_online()
    token, _ = hub_token()
    listing = model_files(repo_id, revision)
    files = listing.files if all_files else listing.wanted
    storage = cache_dir() / f"models--{repo_id.replace('/', '--')}"
    snapshot = storage / "snapshots" / listing.commit
    total = sum(f.size for f in files)
    state = _Reporter(repo_id, total, len(files), progress)
    import filelock

    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    try:
        lock = filelock.FileLock(str(storage / "blobs" / ".hone-download.lock"), timeout=0)
        lock.acquire()
    except filelock.Timeout:
        raise HubError(
            f"{repo_id} is being downloaded by another Hone window or command",
            "wait for that download to end, or stop it first",
        ) from None
    try:
        for file in files:
            target = snapshot / file.name
            if not target.exists():
                fetched = _fetch(repo_id, listing.commit, file, token, storage, state, stop)
                if not fetched:
                    return DownloadResult(
                        repo_id, listing.commit, str(snapshot), False, state.done, total, state.files_done
                    )
                _link(fetched, target)
            state.file_finished(file)
        _write_ref(storage, revision or "main", listing.commit)
    finally:
        lock.release()
    return DownloadResult(repo_id, listing.commit, str(snapshot), True, state.done, total, state.files_done)


class _Reporter:
    """Counts bytes and files and calls the progress callback, throttled."""

    def __init__(self, repo_id: str, total: int, files: int, callback):
        self.repo_id, self.total, self.files_total, self.callback = repo_id, total, files, callback
        self.done = self.files_done = 0
        self._base = 0  # bytes of the files finished so far
        self._last = 0.0

    def file_bytes(self, file: str, have: int, force: bool = False) -> None:
        self.done = self._base + have
        now = time.monotonic()
        if self.callback and (force or now - self._last >= REPORT_EVERY_S):
            self._last = now
            self.callback(
                DownloadProgress(self.repo_id, file, self.done, self.total, self.files_done, self.files_total)
            )

    def file_finished(self, file: HubFile) -> None:
        self._base += file.size
        self.files_done += 1
        self.file_bytes(file.name, 0, force=True)


def _fetch(
    repo_id: str, commit: str, file: HubFile, token: str | None, storage: Path, state: _Reporter, stop: StopFlag | None
) -> Path | None:
    """The blob of `file`, downloaded (or resumed) into `storage/blobs`; None when stopped first."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, file.name, revision=commit, endpoint=endpoint())
    with hub_errors(repo_id, commit, with_token=bool(token)):
        meta = get_hf_file_metadata(url, token=token or False, endpoint=endpoint(), timeout=TIMEOUT_S)
    if not meta.etag:
        raise HubError(
            f"the Hub gave no ETag for {file.name} of {repo_id}, so it cannot be checked",
            "check that HF_ENDPOINT points at a Hugging Face Hub (or a mirror of one)",
            "hub-server",
        )
    etag = meta.etag.strip('"').removeprefix("W/").strip('"')
    size = meta.size if meta.size is not None else file.size
    blob = storage / "blobs" / etag
    if blob.exists() and blob.stat().st_size == size:
        state.file_bytes(file.name, size, force=True)
        return blob
    part = blob.with_name(f"{etag}.part")
    have = part.stat().st_size if part.exists() else 0
    if have > size:  # not a prefix of this file: start it again
        part.unlink()
        have = 0
    if have < size and not _stream(repo_id, meta.location or url, token, part, have, size, file.name, state, stop):
        return None
    _check(part, size, etag, repo_id, file.name)
    os.replace(part, blob)
    return blob


def _stream(
    repo_id: str,
    url: str,
    token: str | None,
    part: Path,
    have: int,
    size: int,
    name: str,
    state: _Reporter,
    stop: StopFlag | None,
) -> bool:
    """Append the rest of the file to `part`, from byte `have`; False when stopped."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    headers = build_hf_headers(token=token or False)
    headers["Accept-Encoding"] = "identity"  # sizes and ranges count the stored bytes
    if urlsplit(url).netloc != urlsplit(endpoint()).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays with the Hub
    if have:
        headers["Range"] = f"bytes={have}-"
    with hub_errors(repo_id, with_token=bool(token)):
        try:
            with get_session().stream("GET", url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True) as r:
                if r.status_code >= 400:
                    r.read()  # hf_raise_for_status reads the error body
                hf_raise_for_status(r)
                if r.status_code != 206:  # the whole file came back: what was kept is replaced
                    have = 0
                with open(part, "ab" if have else "wb") as out:
                    state.file_bytes(name, have, force=True)
                    for chunk in r.iter_bytes(CHUNK_BYTES):
                        out.write(chunk)
                        have += len(chunk)
                        state.file_bytes(name, have)
                        if stop is not None and stop.is_set() and have < size:
                            return False
        except Exception as e:
            if is_connection_problem(e) and part.exists() and 0 < part.stat().st_size < size:
                error = unreachable(type(e).__name__)
                raise HubError(
                    f"{error.message}: {name} stopped at {part.stat().st_size:,} of {size:,} bytes",
                    "download again: it continues from there",
                    error.code,
                ) from None
            raise
    return True


def _check(part: Path, size: int, etag: str, repo_id: str, name: str) -> None:
    """The downloaded file has the Hub's size and, for weights, its sha256; a damaged one is removed."""
    actual = part.stat().st_size
    problem = f"{actual:,} bytes where the Hub lists {size:,}" if actual != size else ""
    if not problem and _SHA256.match(etag):
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK_BYTES * 8):
                digest.update(chunk)
        if digest.hexdigest() != etag:
            problem = "its sha256 differs from the Hub's"
    if problem:
        part.unlink()
        raise HubError(
            f"{name} of {repo_id} arrived damaged ({problem})",
            "download again (the damaged copy was removed)",
            "hub-file",
        )


def _link(blob: Path, target: Path) -> None:
    """`target` in the snapshot folder points at `blob`: a relative symlink, or (where symlinks need rights the
    user lacks, Windows without developer mode) the blob itself moved there, as huggingface_hub does."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(os.path.relpath(blob, target.parent), target)
    except OSError:
        shutil.move(str(blob), str(target))


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/REVISION names the commit, so the model loads by its id offline (not for a commit given as such)."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    temporary = ref.with_name(f".{ref.name}.tmp")
    temporary.write_text(commit)
    os.replace(temporary, ref)

"""What a checkpoint records about the data, to tell a resume what changed: each file's size and sha256
(`data_fingerprint`, streamed, each unchanged file read once per process), the differences in words, and what
decides the pack order besides the files (`layout_of`).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.errors import HoneError

_CHUNK = 1 << 20  # bytes per read while hashing: large enough for full disk speed, small enough to stream
# A file whose ctime is this recent when hashed is hashed again next time: an edit within the filesystem's
# timestamp tick would leave its stat unchanged (git's "racy" entries).
_RACY_NS = 1_000_000_000
# Digests by file identity and stat. Not run state: the hash of unchanged bytes, shared so that `hone train`'s early
# check and the trainer (and the app's next run) read a large file once.
_DIGESTS: dict[tuple, tuple[int, str]] = {}


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: str | Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file, streamed; an unchanged file (same inode, size, mtime and ctime) is
    read once per process."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = (st.st_size, _sha256_of(path))
    if time.time_ns() - st.st_ctime_ns > _RACY_NS:
        _DIGESTS[key] = digest
    return digest


def data_fingerprint(data) -> dict[str, list[dict]]:
    """Each file of a DataConfig's `train` and `eval` entries: {"name", "path", "size", "sha256"}, by side; a folder
    entry lists every file in it, a Hugging Face dataset id is listed without a hash (`layout_of` covers it). An
    entry that resolves to nothing is left out: the data loader says why."""
    from hone.core.data.loaders import SourceError, resolve_sources

    out: dict[str, list[dict]] = {}
    for side, entries in (("train", data.train), ("eval", data.eval)):
        files: list[dict] = []
        for entry in entries:
            try:
                sources = resolve_sources([entry], side=side)
            except (SourceError, HoneError, OSError):
                continue
            for source in sources:
                if source.path is None:
                    files.append({"name": source.name, "hub": True})
                    continue
                root = source.path
                paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
                for p in paths:
                    size, sha = file_digest(p)
                    name = source.name if p == root else f"{source.name}/{p.relative_to(root).as_posix()}"
                    files.append({"name": name, "path": str(p.resolve()), "size": size, "sha256": sha})
        out[side] = files
    return out


def data_differences(before: dict, after: dict) -> dict[str, list[str]]:
    """What differs between two `data_fingerprint`s, in words, by side ("train", "eval")."""
    out: dict[str, list[str]] = {}
    for side in ("train", "eval"):
        old = {f["name"]: f for f in before.get(side, [])}
        new = {f["name"]: f for f in after.get(side, [])}
        lines = []
        for name in [*old, *(n for n in new if n not in old)]:
            o, n = old.get(name), new.get(name)
            if o is None:
                lines.append(f"{name} is new")
            elif n is None:
                lines.append(f"{name} is no longer there")
            elif o.get("hub") or n.get("hub"):
                continue
            elif o["size"] != n["size"]:
                lines.append(
                    f"{name}: {o['size']:,} → {n['size']:,} bytes, sha256 {o['sha256'][:12]}… → {n['sha256'][:12]}…"
                )
            elif o["sha256"] != n["sha256"]:
                lines.append(
                    f"{name}: the same size ({n['size']:,} bytes) but other bytes, sha256 "
                    f"{o['sha256'][:12]}… → {n['sha256'][:12]}…"
                )
        if lines:
            out[side] = lines
    return out


def layout_of(lengths, config: RunConfig, *, batch_tokens: int, tokenizer: str) -> dict:
    """What decides the pack order besides the files: the tokenized rows' lengths (int64 array, one per row), the
    tokenizer's fingerprint, and the packing settings as trained (`batch_tokens` after the memory fit)."""
    import numpy as np

    lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    return {
        "rows": int(lengths.size),
        "tokens": int(lengths.sum()),
        "lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        "tokenizer": tokenizer,
        "batch_tokens": int(batch_tokens),
        "packing": config.speed.packing,
        "seed": config.train.seed,
        "grad_accum": config.train.grad_accum,
    }

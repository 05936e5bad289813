"""Tokenized-dataset cache: a finished split is saved as .npy arrays plus a JSON sidecar, and memory-mapped back.

The key hashes everything that changes the result: each source's content hash, the tokenizer (its full
definition), the chat template and its variables, max_length, overlong, train_on, image_max_side, format,
column mapping, and CACHE_VERSION. Entries are written to a temporary folder and renamed into place, so a run
that dies mid-write leaves no half entry behind.

Values computed from a tokenized split (the reference model's log-probabilities of preference runs) are kept beside
it as checked arrays (`save_checked_arrays`): each array's sha256, dtype and shape are in the entry's meta.json, and
`load_checked_arrays` gives back an entry only when every array matches what was written and what the caller expects.
`tokens_fingerprint` keys such values by the tokens they were computed from.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hone.core.data.rows import ImageRef
from hone.core.data.tokenized import TokenizedSet
from hone.core.resources import cache_root

# Bump when the stored layout or the tokenization rules change, so old entries are not reused.
CACHE_VERSION = 4
_ARRAYS = ("ids", "trained", "offsets", "trained_counts", "row_numbers", "source_index", "truncated")
# The .npy header np.save writes is at most a few hundred bytes: a checked array's file larger than its values plus
# this is not one Hone wrote.
_NPY_HEADER_BYTES = 4096
_META_BYTES = 1 << 20  # a checked entry's meta.json holds a few hashes and the key's description


def default_cache_dir() -> Path:
    """`datasets` under Hone's user cache (`$HONE_CACHE`, else the platform's; see `hone.core.resources.cache_root`)."""
    return cache_root("datasets")


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's full definition (vocabulary, merges, normalizer, added tokens)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    digest.update(json.dumps(getattr(tokenizer, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    digest.update(str(getattr(tokenizer, "eos_token_id", None)).encode())
    return digest.hexdigest()


def cache_key(parts: dict[str, Any]) -> str:
    """A short hex key of a JSON-able description."""
    text = json.dumps({"version": CACHE_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def save(folder: Path, data: TokenizedSet, truncated: np.ndarray, state: dict[str, Any]) -> None:
    """Write one split's arrays and sidecar under folder (atomically)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        arrays = {**data.arrays(), "truncated": truncated}
        for name in _ARRAYS:
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arrays[name]))
        meta = {
            "sources": data.sources,
            "state": state,
            "images": {str(k): [r.to_dict() for r in refs] for k, refs in data.images.items()},
        }
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(folder: Path) -> tuple[TokenizedSet, np.ndarray, dict[str, Any]] | None:
    """The split saved under folder (arrays memory-mapped), or None when absent or unreadable."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
    except (OSError, ValueError, KeyError):
        return None
    images = {int(k): [ImageRef.from_dict(r) for r in refs] for k, refs in meta["images"].items()}
    data = TokenizedSet(
        arrays["ids"],
        arrays["trained"],
        np.asarray(arrays["offsets"]),
        np.asarray(arrays["trained_counts"]),
        meta["sources"],
        np.asarray(arrays["row_numbers"]),
        np.asarray(arrays["source_index"]),
        images,
    )
    return data, np.asarray(arrays["truncated"]), meta["state"]


def tokens_fingerprint(data: TokenizedSet) -> str:
    """A hash of the stored rows under `data` (all of them, whatever subset `data` shows): their token ids, which
    tokens are trained, and where each row starts. Values kept per stored row are keyed by it."""
    arrays = data.arrays()
    digest = hashlib.blake2b(digest_size=16)
    for name in ("ids", "trained", "offsets"):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def save_checked_arrays(folder: Path, arrays: dict[str, np.ndarray], about: dict[str, Any]) -> None:
    """Write named arrays under folder (atomically, replacing an older entry), each with its sha256, dtype and shape
    in meta.json; `about` (JSON) says what they are."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        checks = {}
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
            data = buffer.getvalue()
            (tmp / f"{name}.npy").write_bytes(data)
            checks[name] = {"sha256": hashlib.sha256(data).hexdigest(), "dtype": array.dtype.str, "shape": array.shape}
        (tmp / "meta.json").write_text(json.dumps({"about": about, "arrays": checks}), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_checked_arrays(folder: Path, expected: dict[str, tuple[Any, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """The arrays `save_checked_arrays` wrote under folder, or {} when the entry is absent, damaged (a file cut short
    or changed: its sha256 differs), or not what the caller expects (`expected`: each name's dtype and shape)."""
    try:
        meta_file = folder / "meta.json"
        if meta_file.stat().st_size > _META_BYTES:
            return {}
        checks = json.loads(meta_file.read_text(encoding="utf-8"))["arrays"]
        out = {}
        for name, (dtype, shape) in expected.items():
            dtype = np.dtype(dtype)
            path = folder / f"{name}.npy"
            if path.stat().st_size > dtype.itemsize * int(np.prod(shape)) + _NPY_HEADER_BYTES:
                return {}
            data = path.read_bytes()
            check = checks[name]
            if hashlib.sha256(data).hexdigest() != check["sha256"]:
                return {}
            array = np.load(io.BytesIO(data), allow_pickle=False)
            if array.dtype != dtype or array.shape != tuple(shape):
                return {}
            out[name] = array
        return out
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return {}

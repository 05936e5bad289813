"""Tokenized-dataset cache: a finished split is saved as .npy arrays plus a JSON sidecar, and memory-mapped back.

The key hashes everything that changes the result: each source's content hash, the tokenizer (its full
definition), the chat template and its variables, max_length, overlong, train_on, image_max_side, format,
column mapping, and CACHE_VERSION. Entries are written to a temporary folder and renamed into place, so a run
that dies mid-write leaves no half entry behind.
"""

from __future__ import annotations

import hashlib
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

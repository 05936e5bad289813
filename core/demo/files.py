"""Writing a demo's bundled data files: only when their rows changed, and never half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_splits(folder: Path, splits: tuple[list[dict], list[dict]]) -> tuple[Path, Path]:
    """Write (train rows, held-out rows) as train.jsonl and eval.jsonl into `folder` (made if missing); returns
    their paths. A file that already holds the same rows is left as it is (its tokenized copy in the cache stays
    valid); a changed one is written under a temporary name and renamed into place, so a reader never sees half a
    file."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in zip(("train.jsonl", "eval.jsonl"), splits, strict=True):
        path = folder / name
        text = "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8")
        if not path.is_file() or path.read_bytes() != text:
            handle, partial = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
            with os.fdopen(handle, "wb") as f:
                f.write(text)
            os.replace(partial, path)
        paths.append(path)
    return paths[0], paths[1]

"""Export a trained run (`export_run`: adapter, merged model, GGUF, GGUF LoRA, Ollama; every file read back; its
final adapter, or with `checkpoint=STEP` a saved checkpoint's, whose default folder `checkpoint_output` gives), the
formats on offer, and the checks made before anything is written (`open_run`, `output_folder`).

Light to import; the exporters load torch when `export_run` is first used.
"""

from __future__ import annotations

import importlib

from hone.core.export.formats import DEFAULT_TYPES, FORMAT_TYPES, MANIFEST_FILE, SUPPORTED_FORMATS, parse_format
from hone.core.export.source import open_run, output_folder

# Names whose engine module imports torch: resolved on first use.
_LAZY = {"export_run": "hone.core.export.dispatch", "checkpoint_output": "hone.core.export.dispatch"}

__all__ = [
    "DEFAULT_TYPES",
    "FORMAT_TYPES",
    "MANIFEST_FILE",
    "SUPPORTED_FORMATS",
    "open_run",
    "output_folder",
    "parse_format",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

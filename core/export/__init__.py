"""Export a run: PEFT adapter, merged model, GGUF (model and LoRA), Ollama Modelfile; every file read back.

Public API (stable; the GUI's Export page and `hone export` call it):

    SUPPORTED_FORMATS: dict[str, str]      format -> one-line description
    GGUF_TYPES: dict[str, str]             GGUF weight type -> description (gguf:TYPE and ollama:TYPE)
    FORMAT_TYPES: dict[str, dict]          format -> the types it accepts after a colon
    export_run(run_dir, fmt, out=None, *, force=False, progress=None) -> ExportResult
    export_adapter / export_merged / export_gguf / export_gguf_lora / export_ollama   one per format
    model_card(fmt, base, name) / write_model_card(folder, fmt, base, name)          the README.md beside an export

Importing this package is cheap (no torch); the exporters load torch when called.
"""

from __future__ import annotations

import importlib

from hone.core.export.card import model_card, write_model_card
from hone.core.export.formats import (
    DEFAULT_GGUF_TYPE,
    FORMAT_TYPES,
    GGUF_LORA_TYPES,
    GGUF_TYPES,
    MERGED_TYPES,
    SUPPORTED_FORMATS,
    ExportError,
    ExportResult,
    ExportSpec,
    parse_format,
)

_LAZY = {
    "export_run": "hone.core.export.dispatch",
    "export_adapter": "hone.core.export.adapter",
    "export_merged": "hone.core.export.merged_model",
    "export_gguf": "hone.core.export.gguf_model",
    "export_gguf_lora": "hone.core.export.gguf_lora",
    "export_ollama": "hone.core.export.ollama",
}

__all__ = [
    "DEFAULT_GGUF_TYPE",
    "FORMAT_TYPES",
    "GGUF_LORA_TYPES",
    "GGUF_TYPES",
    "MERGED_TYPES",
    "SUPPORTED_FORMATS",
    "ExportError",
    "ExportResult",
    "ExportSpec",
    "model_card",
    "parse_format",
    "write_model_card",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

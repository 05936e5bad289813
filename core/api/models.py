"""Find and read a model without loading its weights: where a name points (`resolve_source`), its details
(`inspect_model`), its tokenizer (`tokenizer_for`), the one-time GGUF conversion (`pending_conversion`,
`gguf_folder`, `gguf_conversion_folder`), and its mixture-of-experts family (`family_of`).

Light to import; transformers loads when a model's config or tokenizer is read.
"""

from __future__ import annotations

from hone.core.models.load import (
    gguf_conversion_folder,
    gguf_folder,
    inspect_model,
    pending_conversion,
    resolve_source,
    tokenizer_for,
)
from hone.core.speed.moe.families import family_of

__all__ = [
    "family_of",
    "gguf_conversion_folder",
    "gguf_folder",
    "inspect_model",
    "pending_conversion",
    "resolve_source",
    "tokenizer_for",
]

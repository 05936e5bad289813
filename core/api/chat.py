"""Chat with a base model and its fine-tune side by side (`ChatModels`, `GenerationSettings`; the sides are BASE
and TUNED), and evaluate both on held-out prompts (`read_prompts`, `with_references`, `compare`,
`held_out_file`).

Light to import; torch loads with a model.
"""

from __future__ import annotations

from hone.core.inference.chat import BASE, TUNED, ChatModels, GenerationSettings
from hone.core.inference.evaluate import compare, held_out_file, with_references
from hone.core.inference.prompts import read_prompts

__all__ = [
    "BASE",
    "TUNED",
    "ChatModels",
    "GenerationSettings",
    "compare",
    "held_out_file",
    "read_prompts",
    "with_references",
]

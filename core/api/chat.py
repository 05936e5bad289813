"""Chat with a base model and its fine-tune side by side (`ChatModels`, `GenerationSettings`; the sides are BASE
and TUNED), and evaluate both on held-out prompts (`read_prompts`, `with_references`, `compare`,
`held_out_file`) or, for a preference run, on held-out pairs (`held_out_pairs`, `score_pairs`).

Light to import; torch loads with a model.
"""

from __future__ import annotations

from hone.core.inference.chat import BASE, CHAT_REPETITION_PENALTY, TUNED, ChatModels, GenerationSettings
from hone.core.inference.evaluate import compare, held_out_file, with_references
from hone.core.inference.preference_eval import PreferenceScores, held_out_pairs, score_pairs
from hone.core.inference.prompts import read_prompts

__all__ = [
    "BASE",
    "CHAT_REPETITION_PENALTY",
    "TUNED",
    "ChatModels",
    "GenerationSettings",
    "PreferenceScores",
    "compare",
    "held_out_file",
    "held_out_pairs",
    "read_prompts",
    "score_pairs",
    "with_references",
]

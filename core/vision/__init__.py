"""Vision-language fine-tuning: text-only and image rows in the same batches.

Public API:
    FAMILIES, VisionFamily, family_for(model_type), family_of(model)   which family batches how, and why
    collator_for(model, processor, config, dtype) -> VisionCollator    what the trainer batches vision models with
    VisionBatch                                                        a text batch plus its images' model inputs
    (what one image placeholder becomes: hone.core.data.image_tokens)
    ImageTextProcessor                                                 the processor Hone builds where transformers'
                                                                       needs torchvision (Qwen-VL)

Importing this package is light (no torch); the collator and the model builders load on use.
"""

from __future__ import annotations

import importlib

from hone.core.vision.families import (
    FAMILIES,
    GENERIC,
    PACKED,
    PADDED,
    VisionFamily,
    family_for,
    family_of,
    is_vision_processor,
)

__all__ = [
    "FAMILIES",
    "GENERIC",
    "PACKED",
    "PADDED",
    "VisionFamily",
    "collator_for",
    "family_for",
    "family_of",
    "is_vision_processor",
]


def __getattr__(name: str):
    if name == "collator_for":  # loads torch: on use only
        return importlib.import_module("hone.core.vision.collate").collator_for
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

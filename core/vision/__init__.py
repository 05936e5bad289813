"""Vision-language fine-tuning: text-only and image rows in the same batches.

Public API:
    FAMILIES, VisionFamily, family_for(model_type), family_of(model)   which family batches how, and why
    collator_for(model, processor, config, dtype) -> VisionCollator    what the trainer batches vision models with
    VisionBatch                                                        a text batch plus its images' model inputs
    ImageExpansion / image_expansion_for(processor, max_side)          what one image placeholder becomes
    ImageTextProcessor                                                 the processor Hone builds where transformers'
                                                                       needs torchvision (Qwen-VL)

Importing this package is light (no torch); the collator and the model builders load on use.
"""

from __future__ import annotations

from hone.core.vision.families import FAMILIES, GENERIC, PACKED, PADDED, VisionFamily, family_for, family_of


def collator_for(model, processor, config, dtype=None):
    """The VisionCollator for `model` (a transformers or peft model) under a RunConfig."""
    import torch

    from hone.core.vision.collate import VisionCollator

    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    text_tokenizer = getattr(processor, "tokenizer", processor)
    return VisionCollator(family_of(hf), processor, hf.config, image_max_side=config.data.image_max_side,
                          packing=config.speed.packing, pad_id=text_tokenizer.pad_token_id,
                          dtype=dtype or torch.float32)


def is_vision_processor(processor) -> bool:
    """True for a processor that carries an image processor (what vision models load as their tokenizer)."""
    return getattr(processor, "image_processor", None) is not None and hasattr(processor, "tokenizer")


__all__ = ["FAMILIES", "GENERIC", "PACKED", "PADDED", "VisionFamily", "collator_for", "family_for", "family_of",
           "is_vision_processor"]

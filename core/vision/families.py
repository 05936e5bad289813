"""The vision-language families Hone knows: how each one batches, where its vision parts live, what extra inputs
its forward needs.

A family trains on packed rows only when `tests/core/vision` shows packed == per-row losses and gradients; any
other, and any model type without an entry here, trains on padded rows with transformers' own masks. Importing
this module is light (no torch): it is read before a model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

PACKED = "packed"
PADDED = "padded"


@dataclass(frozen=True)
class VisionFamily:
    """One family of vision-language models.

    Attributes:
        name: what people call it ("Qwen2.5-VL").
        model_types: `config.model_type` values that belong to it.
        batching: PACKED or PADDED, how rows share a micro-batch with `speed.packing` on (a PADDED family pads the
            rows of each planned batch to the longest one; why each family is which: the comment above FAMILIES).
            With `speed.packing = false` every family trains one row per micro-batch (padding-free).
        why: one sentence on why, for the run log.
        vision_modules: names of the vision encoder's modules (LoRA stays off them unless asked for).
        projector_modules: names of the vision-to-text projector's modules (`lora.train_projector` trains them).
        mrope: Qwen-style 3-D rope positions built per sequence by Hone (hone.core.vision.mrope).
        nested_pixels: the image processor takes one list of images per sample and returns (1, N, C, H, W).
        token_types: the forward needs `token_type_ids` (1 on image tokens).
    """

    name: str
    model_types: tuple[str, ...]
    batching: str
    why: str
    vision_modules: tuple[str, ...]
    projector_modules: tuple[str, ...]
    mrope: bool = False
    nested_pixels: bool = False
    token_types: bool = False

    def describe(self) -> str:
        return f"{self.name}: {self.batching} rows ({self.why})"


# How each family batches, and why:
# - Qwen2.5-VL, Qwen3-VL: packed. Hone builds the 3-D rope positions per sequence and passes them after the text
#   positions as a 4-row `position_ids`; transformers finds the sequence starts in the text positions and builds a
#   block-diagonal causal mask, so no token sees another row.
# - Idefics3 / SmolVLM, LLaVA: packed. 1-D positions restarting at 0 per row give the same block-diagonal mask; the
#   image features fill the image tokens in order, whichever row they sit in.
# - Gemma 3: padded. Image tokens attend to each other both ways (token_type_ids); Hone keeps the padded layout
#   transformers builds those masks for.
# - Any other family (GENERIC): padded, the safe default (transformers' own masks).
_MROPE_WHY = "3-D rope positions built per sequence; transformers builds a block-diagonal mask from the text positions"
_PLAIN_WHY = "positions restart per sequence, so transformers builds a block-diagonal mask"

FAMILIES: tuple[VisionFamily, ...] = (
    VisionFamily(
        "Qwen2.5-VL",
        ("qwen2_5_vl",),
        PACKED,
        _MROPE_WHY,
        vision_modules=("visual",),
        projector_modules=("merger",),
        mrope=True,
    ),
    VisionFamily(
        "Qwen3-VL",
        ("qwen3_vl", "qwen3_vl_moe"),
        PACKED,
        _MROPE_WHY,
        vision_modules=("visual",),
        projector_modules=("merger", "deepstack_merger_list"),
        mrope=True,
    ),
    VisionFamily(
        "Idefics3 / SmolVLM",
        ("idefics3", "smolvlm"),
        PACKED,
        _PLAIN_WHY,
        vision_modules=("vision_model",),
        projector_modules=("connector",),
        nested_pixels=True,
    ),
    VisionFamily(
        "LLaVA",
        ("llava",),
        PACKED,
        _PLAIN_WHY,
        vision_modules=("vision_tower",),
        projector_modules=("multi_modal_projector",),
    ),
    VisionFamily(
        "Gemma 3",
        ("gemma3",),
        PADDED,
        "image tokens attend both ways inside an image (token_type_ids); kept on transformers' padded masks",
        vision_modules=("vision_tower",),
        projector_modules=("multi_modal_projector",),
        token_types=True,
    ),
)

# Module names that mark vision parts in families Hone has no entry for.
GENERIC = VisionFamily(
    "other vision-language model",
    (),
    PADDED,
    "not verified for packing; padded rows with transformers' own masks",
    vision_modules=("vision_tower", "vision_model", "visual", "image_encoder"),
    projector_modules=("multi_modal_projector", "connector", "merger", "mm_projector"),
)


def family_for(model_type: str) -> VisionFamily:
    """The family of a `config.model_type` (GENERIC when Hone has no entry for it)."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return GENERIC


def family_of(model) -> VisionFamily:
    """The family of a transformers model, or of a peft model around one."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    return family_for(hf.config.model_type)


def is_vision_processor(processor) -> bool:
    """True for a processor that carries an image processor (what vision models load as their tokenizer)."""
    return getattr(processor, "image_processor", None) is not None and hasattr(processor, "tokenizer")

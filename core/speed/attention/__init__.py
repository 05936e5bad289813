"""Attention for packed rows: the backend a run uses (`choice`: configure / revert, probes and why each is taken),
the varlen, flash and sdpa functions registered in transformers' `AttentionInterface` (`backends`; the sdpa ones in
`sdpa_backends`, what they share in `sdpa_fallback`, the batch's metadata and shared masks in `packed_metadata`),
long rows split from short ones (`long_rows`), linear-attention layers (`linear_attention`), the image encoder's
attention (`vision_encoder`) and the grouped backward (`grouped_backward`).
"""

from hone.core.speed.attention.choice import (
    IMPLEMENTATIONS,
    Choice,
    apply_attention,
    choose,
    configure,
    current_implementation,
    language_and_vision_configs,
    packing_blocker,
    probe_long_rows,
    probe_varlen,
    register,
    register_varlen,
    revert,
    revert_attention,
    sink_attention_reference,
    use_per_layer_metadata,
)

__all__ = [
    "IMPLEMENTATIONS",
    "Choice",
    "apply_attention",
    "choose",
    "configure",
    "current_implementation",
    "language_and_vision_configs",
    "packing_blocker",
    "probe_long_rows",
    "probe_varlen",
    "register",
    "register_varlen",
    "revert",
    "revert_attention",
    "sink_attention_reference",
    "use_per_layer_metadata",
]

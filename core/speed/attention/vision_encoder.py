"""The image encoder of Qwen-VL models in one varlen call per layer for all of a batch's images and windows.

transformers' Qwen2.5-VL and Qwen3-VL encoders attend within each image (and, in most Qwen2.5-VL layers, within
each window of an image). With SDPA they split the batch's patches by `cu_seqlens` on the host and call attention
once per window in a Python loop: a 448 px image is 16 windows, so ten images are 160 calls per layer. Their flash
branch instead hands the whole batch and its `cu_seqlens` to the attention function, and transformers takes that
branch for any implementation whose name contains "flash". `VISION_IMPLEMENTATION` is such a name, bound to torch's
`varlen_attn` (bidirectional); a call without `cu_seqlens` (a transformers that still loops) gets SDPA. Some
transformers releases hand the model call's keyword arguments on to the encoder, so the language model's packed
metadata (`cu_seq_lens_q` ...) would collide with the encoder's own: a hook on the encoder drops them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hone.core.speed.attention import backends

# "flash" in the name on purpose (unlike Hone's language-model names): it is what makes the encoder pass cu_seqlens.
VISION_IMPLEMENTATION = "hone_flash_varlen_encoder"
# Encoders that take cu_seqlens (module class names of transformers' vision attention).
VARLEN_ENCODERS = (
    "Qwen2_5_VLVisionAttention",
    "Qwen3VLVisionAttention",
    "Qwen3VLMoeVisionAttention",
    "VisionAttention",
)


def encoder_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    *,
    scaling=None,
    dropout=0.0,
    cu_seq_lens_q=None,
    max_length_q=None,
    **kwargs,
):
    """Bidirectional attention over every image of the batch at once.

    Args:
        query, key, value: (1, heads, patches, head_dim), all images' patches in a row.
        cu_seq_lens_q: (segments + 1,) where each image (or window) starts; None: one segment (SDPA).
        max_length_q: the longest segment (int or 0-d tensor; read from cu_seq_lens_q when None).

    Returns:
        ((1, patches, heads, head_dim), None), as transformers' attention functions return.
    """
    if dropout and module.training:
        raise ValueError("the image encoder's varlen attention has no dropout")
    if cu_seq_lens_q is None:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling)
        return out.transpose(1, 2), None
    from torch.nn.attention.varlen import varlen_attn

    cu = cu_seq_lens_q.to(torch.int32)
    if max_length_q is None:
        max_length_q = (cu[1:] - cu[:-1]).max()
    max_len = int(max_length_q)  # a host read once per layer when transformers hands a tensor
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (patches, heads, head_dim)
    options = backends.varlen_signature()
    full = {"window_size": (-1, -1)} if options.window else {"is_causal": False}
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, **full)
    return out.unsqueeze(0), None


def varlen_encoder_modules(model) -> list[str]:
    """Names of the image encoder's attention modules that take the batch's cu_seqlens (Qwen-VL)."""
    return [
        name
        for name, module in model.named_modules()
        if type(module).__name__ in VARLEN_ENCODERS and ".visual." in f".{name}."
    ]


# The language model's packed metadata, in the model call's keyword arguments: not the encoder's.
TEXT_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_HOOK = "_hone_text_kwargs_hook"  # the encoder module's attribute holding the hook's handle (for the revert)


def _drop_text_kwargs(module, args, kwargs):
    return args, {k: v for k, v in kwargs.items() if k not in TEXT_KWARGS}


def _encoder(hf_model) -> torch.nn.Module:
    """The image encoder itself (`visual`)."""
    name = next(n for n, _ in hf_model.named_modules() if n.split(".")[-1] == "visual")
    return hf_model.get_submodule(name)


def register_encoder() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VISION_IMPLEMENTATION, encoder_attention)


def _set_encoder_implementation(hf_model, name: str) -> None:
    """Put the image encoder (its config, which the encoder module shares) on a registered implementation.

    Set on the config, not through `set_attn_implementation`: from transformers 5.25 that reads any name containing
    "flash" as a request to import flash-attn or fetch a Hub kernel, and refuses `VISION_IMPLEMENTATION`, which is
    neither but is registered with `AttentionInterface` already.
    """
    from transformers import AttentionInterface

    if name not in ("eager", *AttentionInterface().valid_keys()):
        raise ValueError(f"{name!r} is not a registered attention implementation")
    hf_model.config.vision_config._attn_implementation = name
    encoder = _encoder(hf_model)
    if encoder.config._attn_implementation != name:
        raise RuntimeError(
            f"{type(hf_model).__name__}'s image encoder does not read its implementation from "
            "config.vision_config: Hone cannot put it on varlen attention"
        )


def apply_encoder_attention(hf_model) -> str | None:
    """Put the image encoder of a Qwen-VL model on `encoder_attention`; returns its previous implementation (None:
    this model's encoder does not take cu_seqlens, nothing changed)."""
    vision = getattr(hf_model.config, "vision_config", None)
    if vision is None or not varlen_encoder_modules(hf_model):
        return None
    register_encoder()
    previous = vision._attn_implementation
    _set_encoder_implementation(hf_model, VISION_IMPLEMENTATION)
    encoder = _encoder(hf_model)
    if getattr(encoder, _HOOK, None) is None:
        setattr(encoder, _HOOK, encoder.register_forward_pre_hook(_drop_text_kwargs, with_kwargs=True))
    return previous


def revert_encoder_attention(hf_model, previous: str | None) -> None:
    if previous is None:
        return
    _set_encoder_implementation(hf_model, previous)
    encoder = _encoder(hf_model)
    hook = getattr(encoder, _HOOK, None)
    if hook is not None:
        hook.remove()
        delattr(encoder, _HOOK)

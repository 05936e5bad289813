"""What every packed attention backend shares: which calls are not packed causal self-attention and go to
transformers' SDPA (`_hf_sdpa`, with a sliding window's mask), the settings no backend handles, and attention with
sink logits computed densely (`dense_sink_attention`, also the reference the tests and probes compare with).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hone.core.speed.attention.packed_metadata import _count, _packed_metadata, block_causal_mask


def _window(sliding_window) -> int | None:
    return int(sliding_window) if sliding_window else None


def _check_supported(kwargs: dict, sinks: bool = False) -> None:
    """Soft-capping is never handled; sink logits (`s_aux`, gpt-oss) only by varlen with `sinks=True`."""
    if kwargs.get("softcap") is not None or (kwargs.get("s_aux") is not None and not sinks):
        raise ValueError(
            "this packed attention does not handle attention soft-capping or sink logits; "
            "configure() keeps transformers' attention for such models"
        )


def _hf_sdpa(module, query, key, value, attention_mask, **kwargs):
    """Calls without packed metadata (a single unpacked row, an encoder) go to transformers' SDPA.

    With a Hone implementation set, transformers builds no mask, so a causal sliding-window layer gets its
    window mask here (one sequence) instead of silently attending to everything before it.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _count("fallback_calls")
    for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    window = _window(kwargs.get("sliding_window"))
    total = query.shape[2]
    sinks = kwargs.get("s_aux")
    if sinks is not None:  # transformers' SDPA has no sink logits: the dense form, causal over each row
        if attention_mask is not None and attention_mask.dim() == 4:  # a full mask: used as given
            mask = (
                attention_mask
                if attention_mask.dtype == torch.bool
                else attention_mask > torch.finfo(attention_mask.dtype).min / 2
            )  # additive: large negatives are masked
        else:
            whole = torch.tensor([0, key.shape[2]], dtype=torch.int32, device=query.device)
            mask = block_causal_mask(whole, key.shape[2], window)[..., -total:, :]
            if attention_mask is not None:  # a (B, keys) padding mask
                mask = mask & attention_mask.bool()[:, None, None, :]
        dropout = kwargs.get("dropout", 0.0) if module.training else 0.0
        return dense_sink_attention(query, key, value, mask, sinks, kwargs.get("scaling"), dropout), None
    if attention_mask is None and window is not None and window < total == key.shape[2] and _is_causal(module, kwargs):
        whole = torch.tensor([0, total], dtype=torch.int32, device=query.device)
        attention_mask = block_causal_mask(whole, total, window)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _is_causal(module, kwargs: dict) -> bool:
    causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True) if causal is None else causal)


def _needs_fallback(module, query, kwargs, per_layer: bool) -> bool:
    """Calls that are not packed causal self-attention go to transformers' SDPA (with their own mask)."""
    if not _is_causal(module, kwargs):
        return True
    if per_layer:
        return kwargs.get("position_ids") is None
    return _packed_metadata(kwargs) is None


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def dense_sink_attention(
    query, key, value, mask: torch.Tensor, sinks: torch.Tensor | None, scaling=None, dropout: float = 0.0
) -> torch.Tensor:
    """Attention with per-head sink logits (gpt-oss) computed densely, as transformers' eager gpt-oss attention
    does (its dtype, its memory) but under the given boolean mask: (B, H, T, D) query, (B, Hkv, T, D) key / value,
    a mask broadcastable to (B, H, T, T) (True = attend), (H,) sinks (None: plain attention, for references).
    Returns (B, T, H, D)."""
    groups = query.shape[1] // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = (query @ _repeat_kv(key, groups).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if sinks is not None:
        column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, column], dim=-1)
    probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    if dropout:
        probs = F.dropout(probs, p=dropout)
    return (probs.to(value.dtype) @ _repeat_kv(value, groups)).transpose(1, 2).contiguous()

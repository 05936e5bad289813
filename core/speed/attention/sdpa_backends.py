"""Packed attention with torch's SDPA, for GPUs without flash kernels and for CPUs: one block-diagonal causal mask
per batch shared by every layer (`blockmask_attention`), or SDPA on each packed row with its own mask
(`rows_attention`). Called as transformers' `AttentionInterface` calls an attention function (backends.py says how).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hone.core.speed.attention.packed_metadata import (
    _count,
    _packed_metadata,
    _position_mask,
    _shared_lengths,
    _shared_mask,
    metadata_from_position_ids,
)
from hone.core.speed.attention.sdpa_fallback import (
    _check_supported,
    _hf_sdpa,
    _needs_fallback,
    _repeat_kv,
    _window,
    dense_sink_attention,
)

# ---- SDPA with one shared block mask -----------------------------------------------------------------------------


def _blockmask_forward(
    module, query, key, value, attention_mask, *, per_layer, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    if _needs_fallback(module, query, kwargs, per_layer):
        return _hf_sdpa(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            sliding_window=sliding_window,
            **kwargs,
        )
    _check_supported(kwargs, sinks=True)
    batch, _, total, _ = query.shape
    if batch != 1:
        raise ValueError(f"packed attention expects one packed row, got a batch of {batch}")
    window = _window(sliding_window)
    if per_layer:
        mask = _position_mask(kwargs["position_ids"], total, window)
    else:
        mask = _shared_mask(_packed_metadata(kwargs)[0], total, window)
    _count("packed_calls")
    if kwargs.get("s_aux") is not None:
        return dense_sink_attention(
            query, key, value, mask, kwargs["s_aux"], scaling, dropout if module.training else 0.0
        ), None
    groups = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(
        query,
        _repeat_kv(key, groups),
        _repeat_kv(value, groups),
        attn_mask=mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


def blockmask_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA with a block-diagonal causal mask (sliding window respected), built from `cu_seq_lens_q` at the first
    layer of a batch and reused by every later layer (`_shared_mask`)."""
    return _blockmask_forward(module, query, key, value, attention_mask, per_layer=False, **kwargs)


def blockmask_attention_per_layer(module, query, key, value, attention_mask, **kwargs):
    """As `blockmask_attention`, rebuilding the mask from position_ids in every layer (benchmark only)."""
    return _blockmask_forward(module, query, key, value, attention_mask, per_layer=True, **kwargs)


# ---- SDPA on each packed row -------------------------------------------------------------------------------------


def _rows_forward(
    module, query, key, value, attention_mask, *, per_layer, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    if _needs_fallback(module, query, kwargs, per_layer):
        return _hf_sdpa(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            sliding_window=sliding_window,
            **kwargs,
        )
    _check_supported(kwargs)
    batch = query.shape[0]
    if batch != 1:
        raise ValueError(f"packed attention expects one packed row, got a batch of {batch}")
    if per_layer:
        lengths = metadata_from_position_ids(kwargs["position_ids"])[0].diff().tolist()
    else:
        lengths = _shared_lengths(_packed_metadata(kwargs)[0])
    _count("packed_calls")
    window = _window(sliding_window)
    groups = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    outs = []
    for q, k, v in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2), strict=True):
        length = q.shape[2]
        mask = None
        if window is not None and window < length:
            distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]
            mask = ((distance >= 0) & (distance < window)).to(q.device)
        outs.append(
            F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None,
                dropout_p=dropout if module.training else 0.0,
                scale=scaling,
            )
        )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def rows_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA on each packed row with its own causal (or sliding-window) mask. What attention keeps grows with the
    sum of the rows' squared lengths, not the batch's: on a CPU, where SDPA keeps the attention weights for
    backward, a block mask over an 8,192-token batch of a 9-head model held 2.4 GB per layer. Reads the row
    lengths once per batch, which on a GPU would be a host sync: `choose` takes this backend on CPUs only."""
    return _rows_forward(module, query, key, value, attention_mask, per_layer=False, **kwargs)


def rows_attention_per_layer(module, query, key, value, attention_mask, **kwargs):
    """As `rows_attention`, rebuilding the row lengths from position_ids in every layer (benchmark only)."""
    return _rows_forward(module, query, key, value, attention_mask, per_layer=True, **kwargs)

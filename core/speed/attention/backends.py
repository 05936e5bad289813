"""Attention functions for packed rows, in the form transformers' `AttentionInterface` calls them.

`varlen_attention` calls torch's `varlen_attn`, `fa2_attention` flash-attn, `blockmask_attention` SDPA with one
block-diagonal causal mask per batch (GPUs without flash kernels), and `rows_attention` SDPA on each packed row
(CPUs). The one thing to know: each reads
the packed batch's `cu_seq_lens_q/k` (int32 offsets, already on the device) and `max_length_q/k` (Python ints) from
the kwargs `PackedBatch.model_inputs()` gave the model, and uses them as they are: no layer rebuilds them and
nothing asks the GPU for a value, so a step never stalls on a host sync. Shapes (transformers' convention): query
(B, Hq, T, D), key/value (B, Hkv, T, D); output (B, T, Hq, D). Packed rows have B = 1.

Here: the torch varlen and flash-attn backends. The SDPA backends are in sdpa_backends.py, what every backend shares
(the fallback to transformers' SDPA, dense sink attention) in sdpa_fallback.py, and the batch's metadata and shared
masks in packed_metadata.py; this module re-exports their names.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hone.core.speed.attention.long_rows import LongRows
from hone.core.speed.attention.packed_metadata import (  # noqa: F401  (re-exported)
    STATS,
    AttentionStats,
    _count,
    _packed_metadata,
    block_causal_mask,
    metadata_from_position_ids,
    reset_stats,
)
from hone.core.speed.attention.sdpa_backends import (
    blockmask_attention,
    blockmask_attention_per_layer,
    rows_attention,
    rows_attention_per_layer,
)
from hone.core.speed.attention.sdpa_fallback import (
    _check_supported,
    _hf_sdpa,
    _needs_fallback,
    _window,
    dense_sink_attention,  # noqa: F401  (re-exported)
)


def _to_varlen(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B * T, H, D); free when x is the transpose of a contiguous (B, T, H, D) projection."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h, d)


# ---- varlen (torch) ----------------------------------------------------------------------------------------------


def varlen_available() -> bool:
    """Whether this torch has `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class VarlenOptions:
    """How to call this torch's `varlen_attn` for one model, and how to back-propagate it.

    torch 2.11 has `window_size` and passes key/value with fewer heads straight to the flash kernel (which
    supports grouped queries natively); torch 2.12+ also wants `enable_gqa=True` for that. `repeat_kv` is set
    when the probe in `hone.core.speed.attention` finds grouped heads not working, so key/value are expanded
    first. Each model carries its own options in the attention implementation registered for it
    (`register_varlen`), so two models in one process never share them.
    """

    window: bool
    gqa_flag: bool
    repeat_kv: bool = False
    lse: bool = False  # returns the log-sum-exp on request (`return_aux`): what attention sinks need
    grouped_backward: bool = False  # back-propagate a group of whole sequences at a time (grouped_backward.py)
    long_rows: LongRows | None = None  # long sequences through a dense kernel (long_rows.py)


@functools.cache
def varlen_signature() -> VarlenOptions:
    """What this torch's `varlen_attn` accepts (a property of the installed torch, read once)."""
    from torch.nn.attention import varlen

    params = inspect.signature(varlen.varlen_attn).parameters
    return VarlenOptions(
        window="window_size" in params,
        gqa_flag="enable_gqa" in params,
        lse="return_aux" in params and hasattr(varlen, "AuxRequest"),
    )


class SinkRescale(torch.autograd.Function):
    """Attention sinks after flash attention: `out * sigmoid(lse - sink)`, with the saved output kept in step.

    A sink adds e^sink (one logit per head, no value) to every row's softmax denominator Z = e^lse, so the output
    becomes out * Z / (Z + e^sink) = out * w with w = sigmoid(lse - sink). The scores' gradient then has a share
    through lse as well as through out, and the flash backward ignores an lse gradient: it computes
    d scores = p * (dO . v - rowsum(dO * saved_out)). Handing it dO = w * d(out * w) and, as its saved output,
    out * w itself (written into the tensor the attention node saved, without bumping its version: the node
    reads it for exactly this row sum) gives rowsum = w^2 <d, out> = w <d, out> - w (1 - w) <d, out>: the second
    term is lse's share, so the flash backward returns the full gradients of q, k and v.
    """

    @staticmethod
    def forward(ctx, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        wide = torch.promote_types(out.dtype, torch.float32)  # float32 for 16-bit attention
        weight = torch.sigmoid(lse.to(wide) - sinks.to(wide)[None, :])  # (T, H)
        scaled = out * weight[..., None].to(out.dtype)
        out.data.copy_(scaled)  # the attention node's saved output (see above)
        ctx.save_for_backward(scaled, weight)
        ctx.sinks_dtype = sinks.dtype
        return scaled

    @staticmethod
    def backward(ctx, d_scaled: torch.Tensor):
        scaled, weight = ctx.saved_tensors
        d_out = d_scaled * weight[..., None].to(d_scaled.dtype)
        # d sink = -sum over tokens of <d, out> w (1 - w) = -sum <d, out * w> (1 - w)
        d_sinks = -((d_scaled.to(weight.dtype) * scaled.to(weight.dtype)).sum(-1) * (1.0 - weight)).sum(0)
        return d_out, None, d_sinks.to(ctx.sinks_dtype)


def _rows_by_heads(lse: torch.Tensor, tokens: int, heads: int) -> torch.Tensor:
    """The log-sum-exp as (T, H): flash's varlen kernels give it (H, T)."""
    return lse if lse.shape == (tokens, heads) else lse.transpose(0, 1)


def _varlen(
    query, key, value, cu, max_len, scaling, window, sinks=None, options: VarlenOptions | None = None, module=None
):
    from torch.nn.attention.varlen import varlen_attn

    value_dim = value.shape[-1]
    if value_dim != query.shape[-1]:
        # MLA (DeepSeek-V3, GLM-4.7-Flash): v's head dim is smaller than q/k's, which the flash kernels do not take.
        # Zero columns added to v give zero output columns, cut off again.
        if value_dim > query.shape[-1]:
            raise ValueError(f"value head dim {value_dim} is larger than the query's {query.shape[-1]}")
        out = _varlen(
            query,
            key,
            F.pad(value, (0, query.shape[-1] - value_dim)),
            cu,
            max_len,
            scaling,
            window,
            sinks,
            options,
            module,
        )
        return out[..., :value_dim]
    options = options or varlen_signature()
    q, k, v = _to_varlen(query), _to_varlen(key), _to_varlen(value)
    kwargs = {"scale": scaling}
    grouped = q.shape[1] != k.shape[1]
    if grouped and options.repeat_kv:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    elif grouped and options.gqa_flag:
        kwargs["enable_gqa"] = True
    if options.window:
        # A tuple: varlen_attn treats exactly (-1, 0) as plain causal attention.
        kwargs["window_size"] = (window - 1, 0) if window is not None else (-1, 0)
    elif window is not None:
        raise ValueError("this torch's varlen_attn has no window_size; a sliding-window model needs torch >= 2.11")
    else:
        kwargs["is_causal"] = True

    def attend(q, k, v, cu, max_len):
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)

    long = options.long_rows
    if (
        long is not None
        and sinks is None
        and window is None
        and not options.grouped_backward
        and max_len >= long.threshold
    ):
        from hone.core.speed.attention import long_rows

        span_list = long_rows.spans(cu, long.threshold)
        if span_list is not None and span_list[-1].end == q.shape[0]:
            return long_rows.attention(q, k, v, cu, span_list, scaling, attend, long, module)

    if sinks is not None:
        if not options.lse or options.grouped_backward:
            raise ValueError(
                "attention sinks need varlen_attn's log-sum-exp (torch >= 2.10) and whole-batch "
                "backward; configure() keeps transformers' attention otherwise"
            )
        from torch.nn.attention.varlen import AuxRequest

        out, lse = varlen_attn(q, k, v, cu, cu, max_len, max_len, return_aux=AuxRequest(lse=True), **kwargs)
        return SinkRescale.apply(out, _rows_by_heads(lse, *out.shape[:2]), sinks)
    if not options.grouped_backward:
        return attend(q, k, v, cu, max_len)
    from hone.core.speed.attention.grouped_backward import attention

    return attention(q, k, v, cu, max_len, attend)


def _varlen_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    *,
    per_layer,
    options=None,
    scaling=None,
    dropout=0.0,
    sliding_window=None,
    **kwargs,
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
    if dropout and module.training:
        raise ValueError("varlen attention has no attention dropout; configure() keeps SDPA for such models")
    if per_layer:
        cu, max_len = metadata_from_position_ids(kwargs["position_ids"])
    else:
        cu, max_len = _packed_metadata(kwargs)
    _count("packed_calls")
    out = _varlen(
        query,
        key,
        value,
        cu,
        max_len,
        scaling,
        _window(sliding_window),
        sinks=kwargs.get("s_aux"),
        options=options,
        module=module,
    )
    return out.view(query.shape[0], query.shape[2], query.shape[1], -1), None


def varlen_attention(module, query, key, value, attention_mask, *, options: VarlenOptions | None = None, **kwargs):
    """Packed attention with torch's `varlen_attn`, metadata from the batch; `options` as the model's probe found
    them (None: as this torch's signature says, whole-batch backward)."""
    return _varlen_forward(module, query, key, value, attention_mask, per_layer=False, options=options, **kwargs)


def varlen_attention_per_layer(
    module, query, key, value, attention_mask, *, options: VarlenOptions | None = None, **kwargs
):
    """As `varlen_attention`, rebuilding cu_seqlens/max from position_ids in every layer (benchmark only)."""
    return _varlen_forward(module, query, key, value, attention_mask, per_layer=True, options=options, **kwargs)


# ---- flash-attn package ------------------------------------------------------------------------------------------


def fa2_available() -> bool:
    """Whether the flash-attn package (with its varlen function) is importable."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:  # a broken CUDA build raises more than ImportError
        return False
    return True


def _fa2_forward(
    module, query, key, value, attention_mask, *, per_layer, scaling=None, dropout=0.0, sliding_window=None, **kwargs
):
    from flash_attn import flash_attn_varlen_func

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
    if kwargs.get("s_aux") is not None:
        raise ValueError("flash-attn has no sink logits; configure() keeps transformers' attention for such models")
    if per_layer:
        cu, max_len = metadata_from_position_ids(kwargs["position_ids"])
    else:
        cu, max_len = _packed_metadata(kwargs)
    _count("packed_calls")
    window = _window(sliding_window)
    out = flash_attn_varlen_func(
        _to_varlen(query),
        _to_varlen(key),
        _to_varlen(value),
        cu,
        cu,
        max_len,
        max_len,
        dropout_p=dropout if module.training else 0.0,
        softmax_scale=scaling,
        causal=True,
        window_size=(window - 1, 0) if window is not None else (-1, -1),
        softcap=kwargs.get("softcap") or 0.0,
    )
    return out.view(query.shape[0], query.shape[2], query.shape[1], -1), None


def fa2_attention(module, query, key, value, attention_mask, **kwargs):
    """Packed attention with flash-attn's `flash_attn_varlen_func`, metadata from the batch."""
    return _fa2_forward(module, query, key, value, attention_mask, per_layer=False, **kwargs)


def fa2_attention_per_layer(module, query, key, value, attention_mask, **kwargs):
    """As `fa2_attention`, rebuilding the metadata from position_ids in every layer (benchmark only)."""
    return _fa2_forward(module, query, key, value, attention_mask, per_layer=True, **kwargs)


# Each function -> the same function rebuilding cu_seqlens / the mask from `position_ids` in every layer, the way
# transformers' own flash path does (with its host syncs): benchmark only, to show what building once per batch buys.
PER_LAYER_METADATA = {
    varlen_attention: varlen_attention_per_layer,
    fa2_attention: fa2_attention_per_layer,
    blockmask_attention: blockmask_attention_per_layer,
    rows_attention: rows_attention_per_layer,
}

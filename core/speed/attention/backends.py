"""Attention functions for packed rows, in the form transformers' `AttentionInterface` calls them.

`varlen_attention` calls torch's `varlen_attn`, `fa2_attention` flash-attn, `blockmask_attention` SDPA with one
block-diagonal causal mask per batch (GPUs without flash kernels), and `rows_attention` SDPA on each packed row
(CPUs). The one thing to know: each reads
the packed batch's `cu_seq_lens_q/k` (int32 offsets, already on the device) and `max_length_q/k` (Python ints) from
the kwargs `PackedBatch.model_inputs()` gave the model, and uses them as they are: no layer rebuilds them and
nothing asks the GPU for a value, so a step never stalls on a host sync. Shapes (transformers' convention): query
(B, Hq, T, D), key/value (B, Hkv, T, D); output (B, T, Hq, D). Packed rows have B = 1.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hone.core.speed.attention.long_rows import LongRows


@dataclass
class AttentionStats:
    """Counts of metadata work, for the benchmark and the tests.

    Attributes:
        mask_builds: dense block masks built by the block-mask backend.
        metadata_builds: cu_seqlens/max rebuilt from position_ids (per-layer mode only).
        packed_calls: attention calls that used the batch's packed metadata.
        fallback_calls: calls without packed metadata, handed to transformers' SDPA.
        length_reads: row lengths read from cu_seqlens by the per-row backend.
    """

    mask_builds: int = 0
    metadata_builds: int = 0
    packed_calls: int = 0
    fallback_calls: int = 0
    length_reads: int = 0


STATS = AttentionStats()


def _count(counter: str) -> None:
    """Add one to a `STATS` counter, except while dynamo traces the caller.

    A Python int that changes on every call is, to dynamo, a constant it guards on: counting inside a compiled
    decoder block recompiled the block at every layer until `recompile_limit` stopped compiling it. Compiled
    calls are therefore not counted (the counters serve the eager benchmark and the tests).
    """
    if not torch.compiler.is_compiling():
        setattr(STATS, counter, getattr(STATS, counter) + 1)


def reset_stats() -> AttentionStats:
    """Zero the counters and return the object holding them."""
    STATS.mask_builds = STATS.metadata_builds = STATS.packed_calls = STATS.fallback_calls = STATS.length_reads = 0
    return STATS


# ---- metadata ----------------------------------------------------------------------------------------------------


def _packed_metadata(kwargs: dict) -> tuple[torch.Tensor, int] | None:
    cu = kwargs.get("cu_seq_lens_q")
    max_len = kwargs.get("max_length_q")
    if cu is None or max_len is None:
        return None
    return cu, int(max_len)


def metadata_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """cu_seqlens (int32) and the longest length, derived from position ids restarting at 0.

    This is what a layer has to do when it is not handed the batch's metadata; `nonzero` and `.item()` each
    make the host wait for the GPU.
    """
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1).to(torch.int32)
    end = torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)
    cu = torch.cat([starts, end])
    _count("metadata_builds")
    return cu, int(cu.diff().max().item())


def block_causal_mask(cu_seqlens: torch.Tensor, total: int, sliding_window: int | None = None) -> torch.Tensor:
    """Dense (1, 1, T, T) bool mask: query i sees key j iff both are in the same sequence, j <= i, and (with a
    window W) i - j < W, which is transformers' convention (W tokens including the query itself).

    Built on `cu_seqlens`' device from the offsets alone (no host sync).
    """
    _count("mask_builds")
    index = torch.arange(total, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:].to(torch.int64), index, right=True)
    distance = index[:, None] - index[None, :]
    mask = (seq[:, None] == seq[None, :]) & (distance >= 0)
    if sliding_window is not None:
        mask &= distance < sliding_window
    return mask[None, None]


# Masks of the batches in flight, keyed by the identity of their cu_seqlens tensor: gradient-checkpoint
# recomputation (same kwargs, same tensor) finds the mask its forward built, and an entry is dropped once its
# batch is freed. Two entries cover a forward overlapping the previous batch's backward.
_MASKS: list[tuple[weakref.ref, dict]] = []
_MASK_BATCHES = 2


def _batch_cache(cu: torch.Tensor) -> dict:
    """What was built for the batch whose offsets are `cu` (empty the first time a layer asks)."""
    _MASKS[:] = [(ref, masks) for ref, masks in _MASKS if ref() is not None]
    per_batch = next((masks for ref, masks in _MASKS if ref() is cu), None)
    if per_batch is None:
        per_batch = {}
        _MASKS.insert(0, (weakref.ref(cu), per_batch))
        del _MASKS[_MASK_BATCHES:]
    return per_batch


def _shared_mask(cu: torch.Tensor, total: int, window: int | None) -> torch.Tensor:
    per_batch = _batch_cache(cu)
    key = (total, window)
    if key not in per_batch:
        per_batch[key] = block_causal_mask(cu, total, window)
    return per_batch[key]


def _shared_lengths(cu: torch.Tensor) -> list[int]:
    """The batch's row lengths as Python ints, read once per batch (on the CPU, where reading is no sync)."""
    per_batch = _batch_cache(cu)
    if "lengths" not in per_batch:
        _count("length_reads")
        per_batch["lengths"] = cu.diff().tolist()
    return per_batch["lengths"]


def _position_mask(position_ids: torch.Tensor, total: int, window: int | None) -> torch.Tensor:
    """The mask rebuilt from position ids (per-layer mode): sequence index = running count of restarts."""
    _count("mask_builds")
    seq = torch.cumsum((position_ids.reshape(-1) == 0).to(torch.int64), 0)
    index = torch.arange(total, device=position_ids.device)
    distance = index[:, None] - index[None, :]
    mask = (seq[:, None] == seq[None, :]) & (distance >= 0)
    if window is not None:
        mask &= distance < window
    return mask[None, None]


# ---- shared helpers ----------------------------------------------------------------------------------------------


def _window(sliding_window) -> int | None:
    return int(sliding_window) if sliding_window else None


def _check_supported(kwargs: dict, sinks: bool = False) -> None:
    """Soft-capping is never handled; sink logits (`s_aux`, gpt-oss) only by varlen with `sinks=True`."""
    if kwargs.get("softcap") is not None or (kwargs.get("s_aux") is not None and not sinks):
        raise ValueError(
            "this packed attention does not handle attention soft-capping or sink logits; "
            "configure() keeps transformers' attention for such models"
        )


def _to_varlen(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B * T, H, D); free when x is the transpose of a contiguous (B, T, H, D) projection."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h, d)


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


# Each function -> the same function rebuilding cu_seqlens / the mask from `position_ids` in every layer, the way
# transformers' own flash path does (with its host syncs): benchmark only, to show what building once per batch buys.
PER_LAYER_METADATA = {
    varlen_attention: varlen_attention_per_layer,
    fa2_attention: fa2_attention_per_layer,
    blockmask_attention: blockmask_attention_per_layer,
    rows_attention: rows_attention_per_layer,
}

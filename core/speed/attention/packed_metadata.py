"""The packed batch's metadata as the attention backends read it: cu_seqlens and the longest row from the kwargs
(or rebuilt from position ids, per layer, for the benchmark), block-diagonal causal masks and row lengths built once
per batch and shared by every layer, and the counters of that work (`STATS`) for the benchmark and the tests.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


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

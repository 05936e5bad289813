"""Host-side sequence lengths of the packed batches in flight, recorded once when a batch is built.

Every layer call of a packed batch carries its device `cu_seqlens`; what needs the lengths on the host (layer
groups in activation checkpointing, long rows in attention) finds them here by that tensor's identity, so no layer
asks the GPU. `PackedBatch.model_inputs` registers each batch; a batch that was not registered reads as unknown.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


@dataclass
class _Batch:
    cu: weakref.ref
    seq_lens: tuple[int, ...]
    derived: dict  # what is derived from the lengths once per batch, keyed by its maker (`registered`)


# Packed batches in flight, keyed by the identity of their device `cu_seqlens` (what every layer call carries).
# Entries go when their batch is freed; a few cover a forward overlapping the previous batch's backward.
_BATCHES: list[_Batch] = []
_KEEP = 4


def register_batch(cu_seqlens: torch.Tensor, seq_lens: list[int] | tuple[int, ...]) -> None:
    """Remember the host-side sequence lengths behind a batch's `cu_seqlens` (the tensor the model call gets)."""
    _BATCHES[:] = [b for b in _BATCHES if b.cu() is not None and b.cu() is not cu_seqlens]
    _BATCHES.insert(0, _Batch(weakref.ref(cu_seqlens), tuple(int(n) for n in seq_lens), {}))
    del _BATCHES[_KEEP:]


def registered(cu_seqlens: torch.Tensor) -> tuple[tuple[int, ...], dict] | None:
    """(host-side sequence lengths, a dict that lives as long as the batch) of a registered batch, else None.

    The dict is where what is derived from the lengths once per batch is kept (keyed by its maker)."""
    batch = next((b for b in _BATCHES if b.cu() is cu_seqlens), None)
    return None if batch is None else (batch.seq_lens, batch.derived)

"""Routing grouped once per MoE layer call: every (token, slot) pair sorted by expert, with group offsets.

All of it runs on the device without reading a value back; only the plain-torch backend asks for the group
bounds on the host (`Routing.bounds`, one copy per layer call, shared by its forward and backward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Routing:
    """The router's top-k choice of one layer call, in expert-sorted order.

    S = tokens * top_k sorted rows. Sorted row s is pair perm[s] of the flattened (tokens, top_k) choice.

    Attributes:
        perm: (S,) int64, flat index t * top_k + k of each sorted row (a stable sort: token order within an expert).
        token: (S,) int64, the token (row of the layer input) of each sorted row: perm // top_k.
        expert: (S,) int16 (int32 past 32,767 experts), the expert of each sorted row (non-decreasing); index
            with `expert.long()`.
        group_ends: (E,) int32, cumulative rows per expert; expert e owns sorted rows [group_ends[e-1], group_ends[e]).
        num_tokens, top_k, num_experts: the problem's sizes.
        cache: device tensors that backends derive from group_ends (reused by every GEMM of the call).
    """

    perm: torch.Tensor
    token: torch.Tensor
    expert: torch.Tensor
    group_ends: torch.Tensor
    num_tokens: int
    top_k: int
    num_experts: int
    cache: dict = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.num_tokens * self.top_k

    @property
    def counts(self) -> torch.Tensor:
        """(E,) int32 rows (tokens) per expert."""
        return torch.diff(self.group_ends, prepend=self.group_ends.new_zeros(1))

    def bounds(self) -> list[tuple[int, int]]:
        """[(begin, end)] of each expert's rows, on the host (one device-to-host copy, then cached)."""
        if "bounds" not in self.cache:
            ends = self.group_ends.tolist()
            self.cache["bounds"] = list(zip([0, *ends[:-1]], ends, strict=True))
        return self.cache["bounds"]


def route(top_k_index: torch.Tensor, num_experts: int) -> Routing:
    """Group the router's choices by expert.

    Args:
        top_k_index: (T, K) integer expert ids in [0, num_experts).
        num_experts: E.

    Returns:
        The `Routing` of this call.
    """
    num_tokens, top_k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    # The radix sort makes one pass per key byte: int16 ids (any router up to 32,767 experts) take 2 passes where
    # the router's int64 ids take 8.
    key_dtype = torch.int16 if num_experts <= torch.iinfo(torch.int16).max else torch.int32
    expert, perm = torch.sort(flat.to(key_dtype), stable=True)
    # searchsorted on the sorted ids gives each group's end directly: no bincount (which syncs on CUDA to size
    # its output), no atomics, deterministic.
    group_ends = torch.searchsorted(expert, _boundaries(num_experts, expert.dtype, flat.device), out_int32=True)
    return Routing(
        perm=perm,
        token=torch.div(perm, top_k, rounding_mode="floor"),
        expert=expert,
        group_ends=group_ends,
        num_tokens=num_tokens,
        top_k=top_k,
        num_experts=num_experts,
    )


_BOUNDARIES: dict[tuple, torch.Tensor] = {}


def _boundaries(num_experts: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """1, 2, ..., E on the device (made once per size: every layer call asks for the same one)."""
    key = (num_experts, dtype, device)
    if key not in _BOUNDARIES:
        _BOUNDARIES[key] = torch.arange(1, num_experts + 1, device=device, dtype=dtype)
    return _BOUNDARIES[key]

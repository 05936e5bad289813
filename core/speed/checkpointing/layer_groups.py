"""Checkpointed decoder layers recomputed and back-propagated a group of whole sequences at a time.

What a recomputed layer saves for its backward, and the gradients its backward makes, then exist for one group
instead of the whole batch (docs/performance/memory.md); every FLOP still runs once, since in a packed batch only
attention mixes tokens and it never crosses a sequence boundary. The one thing to know: group boundaries come from
the host-side sequence lengths each batch registers (hone.core.data.batch_lengths), so choosing them asks the GPU
nothing, and a batch that was not registered is back-propagated whole. `LayerCall.groups` says when grouping
applies; the checkpointer runs the groups (`speed.layer_group_tokens`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from hone.core.data.batch_lengths import registered

# Elements of one (group tokens x hidden) activation: 2**24 = 32 MiB in bf16 (a hidden size of 4,096 gives 4,096
# tokens per group).
# A layer saves about eight such tensors for its backward and its backward makes as many again.
TILE_ELEMENTS = 2**24
# Fewer tokens than this per group make the projections' GEMMs too short to keep a large GPU busy.
MIN_TILE_TOKENS = 1024

# Keyword arguments a layer call may carry and how a group gets its own: sliced along tokens, or replaced.
_SLICED = ("position_ids", "position_embeddings")
_REPLACED = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def auto_group_tokens(hidden_size: int) -> int:
    """Tokens per group for `speed.layer_group_tokens = -1` (auto)."""
    return max(MIN_TILE_TOKENS, TILE_ELEMENTS // max(int(hidden_size), 1))


def group_sequences(seq_lens: list[int] | tuple[int, ...], max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sequences taken together, at most `max_tokens` tokens per group (a longer sequence alone).

    Returns:
        (first sequence, one past the last sequence) per group, in order.
    """
    groups: list[tuple[int, int]] = []
    first, tokens = 0, 0
    for index, n in enumerate(seq_lens):
        if tokens and tokens + n > max_tokens:
            groups.append((first, index))
            first, tokens = index, 0
        tokens += n
    if tokens:
        groups.append((first, len(seq_lens)))
    return groups


@dataclass(frozen=True)
class SequenceGroup:
    """One group of a packed batch: tokens `start:end`, their own offsets (int32, on the batch's device, starting
    at 0) and longest sequence."""

    start: int
    end: int
    cu_seqlens: torch.Tensor
    max_len: int


def groups_for(cu_seqlens: torch.Tensor, max_tokens: int) -> list[SequenceGroup] | None:
    """The groups of a registered batch (built once per batch and group size), or None for an unknown batch."""
    found = registered(cu_seqlens)
    if found is None:
        return None
    seq_lens, derived = found
    if max_tokens not in derived:
        groups, offsets = [], [0]
        for n in seq_lens:
            offsets.append(offsets[-1] + n)
        for first, last in group_sequences(seq_lens, max_tokens):
            # Sliced from the device offsets: the values never travel back to the host.
            local = cu_seqlens[first : last + 1] - cu_seqlens[first]
            groups.append(SequenceGroup(offsets[first], offsets[last], local, max(seq_lens[first:last])))
        derived[max_tokens] = groups
    return derived[max_tokens]


def _has_dropout(layer: torch.nn.Module | None) -> bool:
    if layer is None:
        return True  # unknown layer: cannot rule dropout out
    for module in layer.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0 and module.training:
            return True
        if float(getattr(module, "attention_dropout", 0.0) or 0.0) > 0 and module.training:
            return True
    return False


def _slice(value, start: int, end: int):
    """A token slice of a (1, T, ...) tensor, or of each tensor of a tuple of them (the rotary cos/sin)."""
    if isinstance(value, tuple):
        return tuple(_slice(v, start, end) for v in value)
    return value[:, start:end]


def _token_major(value, total: int) -> bool:
    """None, or a (1, T, ...) tensor: what `_slice` can cut (not e.g. multimodal rotary tables (3, 1, T, D))."""
    return value is None or (
        torch.is_tensor(value) and value.dim() >= 2 and value.shape[0] == 1 and value.shape[1] == total
    )


class LayerCall:
    """One decoder layer call as transformers hands it to the checkpointer: `function(hidden, *rest, **kwargs)`.

    transformers binds the layer's keyword arguments into `function` (a `functools.partial`); `groups` reads them
    there to make each group's call.
    """

    def __init__(self, function, rest: tuple, kwargs: dict, layer: torch.nn.Module | None):
        self.function, self.rest, self.kwargs, self.layer = function, rest, kwargs, layer

    def __call__(self, hidden: torch.Tensor):
        return self.function(hidden, *self.rest, **self.kwargs)

    def _bound(self) -> dict:
        bound = dict(self.function.keywords) if isinstance(self.function, functools.partial) else {}
        bound.update(self.kwargs)
        return bound

    def groups(self, hidden: torch.Tensor, max_tokens: int) -> list[tuple[SequenceGroup, LayerCall]] | None:
        """(group, the call for that group) pairs when this call can be back-propagated in groups, else None.

        Each group's call recomputes its slice of the layer from its slice of the saved input, with the group's own
        `cu_seqlens` (the batch's offsets minus the group's start: a device op, no host sync), `max_length`,
        `position_ids` and rotary tables; the checkpointer back-propagates its slice of the output gradient and
        writes its slice of the input gradient, and parameter gradients accumulate across groups.

        It applies to one packed row (batch size 1) longer than `max_tokens` whose `cu_seq_lens_q` was registered,
        with no attention mask, no tensor argument other than the ones sliced or replaced here, and no dropout in
        the layer (a group-wise recompute would draw other masks than the forward did).

        Args:
            hidden: (1, T, H) saved layer input.
            max_tokens: the most tokens per group (a longer sequence is a group of its own).
        """
        if max_tokens <= 0 or hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[1] <= max_tokens:
            return None
        if any(torch.is_tensor(r) for r in self.rest) or _has_dropout(self.layer):
            return None
        bound = self._bound()
        cu = bound.get("cu_seq_lens_q")
        if cu is None or bound.get("cu_seq_lens_k") is not cu or bound.get("attention_mask") is not None:
            return None
        total = hidden.shape[1]
        for name, value in bound.items():
            if name in _SLICED:
                if not all(_token_major(v, total) for v in (value if isinstance(value, tuple) else (value,))):
                    return None
                continue
            if name in _REPLACED:
                continue
            if torch.is_tensor(value) or (isinstance(value, (tuple, list)) and any(map(torch.is_tensor, value))):
                return None  # a tensor argument we do not know how to cut
        groups = groups_for(cu, max_tokens)
        if groups is None or len(groups) < 2 or groups[-1].end != hidden.shape[1]:
            return None
        calls = []
        for group in groups:
            own = {name: _slice(bound[name], group.start, group.end) for name in _SLICED if bound.get(name) is not None}
            own.update(
                cu_seq_lens_q=group.cu_seqlens,
                cu_seq_lens_k=group.cu_seqlens,
                max_length_q=group.max_len,
                max_length_k=group.max_len,
            )
            if isinstance(self.function, functools.partial):
                function = functools.partial(
                    self.function.func, *self.function.args, **{**self.function.keywords, **own}
                )
                kwargs = {k: v for k, v in self.kwargs.items() if k not in own}
            else:
                function, kwargs = self.function, {**self.kwargs, **own}
            calls.append((group, LayerCall(function, self.rest, kwargs, self.layer)))
        return calls

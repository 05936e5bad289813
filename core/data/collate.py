"""Batches for training: packed (padding-free) rows with their sequence metadata, and padded rows.

Everything that says where the sequences start and end (lengths, cumulative offsets, the longest length, the number
of trained tokens) is computed here, once per batch, on the CPU, so the attention backends never rebuild it and a
training step never waits for the GPU to answer a question. Targets are shifted here too: the last token of every
sequence gets -100, so no loss ever crosses a sequence boundary and the loss needs no shift of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol

import numpy as np
import torch

from hone.core.data.batch_lengths import register_batch
from hone.core.errors import DataError

IGNORE_INDEX = -100


class TokenizedRowLike(Protocol):
    """What the collators read from a row: token ids and per-token labels (-100 = no loss on this token)."""

    input_ids: Sequence[int]
    labels: Sequence[int]


def shifted_targets(input_ids: Sequence[int], labels: Sequence[int]) -> list[int]:
    """Next-token targets for one sequence.

    `targets[t] = input_ids[t + 1]` where `labels[t + 1] != -100`, else -100; the last position is always -100.
    The label at position `t + 1` decides whether the prediction made at `t` is trained (the usual causal-LM
    convention: `labels` marks the tokens to be produced).
    """
    n = len(input_ids)
    out = [IGNORE_INDEX] * n
    for t in range(n - 1):
        if labels[t + 1] != IGNORE_INDEX:
            out[t] = input_ids[t + 1]
    return out


def _check_row(index: int, row: TokenizedRowLike) -> None:
    n = len(row.input_ids)
    if n == 0:
        raise DataError(
            f"batch row {index} has no tokens", "drop empty rows before batching (the data report lists them)"
        )
    if len(row.labels) != n:
        raise DataError(
            f"batch row {index} has {n} input_ids but {len(row.labels)} labels",
            "labels must have one entry per token (-100 where no loss is taken)",
        )


def _pinned(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    return tensor.pin_memory() if pin and torch.cuda.is_available() else tensor


def _move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One copy to `device`; from pinned host memory to CUDA it is asynchronous (no host sync)."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


@dataclass
class PackedBatch:
    """Several sequences packed into one row, with their boundaries computed once on the CPU.

    The boundaries are Python ints or small int tensors. The attention backends in `hone.core.speed.attention` read
    them from the kwargs transformers passes down to every layer (`model_inputs`) and never rebuild them; the
    trainer reads the counts from the CPU side.

    Attributes:
        input_ids: (1, T) int64 token ids, sequences end to end.
        position_ids: (1, T) int64, restarting at 0 at each sequence start.
        targets: (1, T) int64 next-token targets within each sequence; -100 at each sequence's last token and
            wherever the next token carries no loss.
        seq_lens: length of each packed sequence (sums to T).
        cu_seqlens: (n + 1,) int32 cumulative offsets, `[0, len0, len0 + len1, ..., T]`.
        max_seqlen: the longest sequence, a Python int.
        num_tokens: real tokens in the batch (T: a packed batch has no padding).
        num_trained: positions with `targets != -100`, known on the CPU so the loss divisor needs no sync.
        trained_positions: (num_trained,) int64 flat indices of those positions, so the loss can gather them
            without asking the GPU how many there are.
        input_rows: (1, T, H) the ids' input-embedding rows, gathered on the host when the embedding table lives
            there (`hone.core.speed.host_tables`); the model then gets them instead of the ids.
        desirable: (n,) bool, each sequence's label where its rows carry one (`desirable`: KTO's unpaired
            preference rows, hone.core.data.unpaired); None otherwise.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    seq_lens: list[int]
    cu_seqlens: torch.Tensor
    max_seqlen: int
    num_tokens: int
    num_trained: int
    trained_positions: torch.Tensor | None = None
    input_rows: torch.Tensor | None = None
    desirable: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch on `device`; tensors are copied without blocking (pinned memory to CUDA)."""
        device = torch.device(device)
        moved = {
            f.name: _move(getattr(self, f.name), device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def model_inputs(self) -> dict:
        """Keyword arguments for `model(**...)`.

        `cu_seq_lens_q/k` and `max_length_q/k` are the names transformers forwards from the model call to every
        attention call; Hone's attention backends (and transformers' own flash-attention path) read them instead
        of deriving the boundaries from `position_ids` in every layer.
        """
        # Lets checkpointed layers back-propagate a group of whole sequences at a time (speed.layer_group_tokens).
        register_batch(self.cu_seqlens, self.seq_lens)
        return {
            **_token_inputs(self.input_ids, self.input_rows),
            "position_ids": self.position_ids,
            "use_cache": False,
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
        }


def _token_inputs(input_ids: torch.Tensor, input_rows: torch.Tensor | None) -> dict:
    """The ids, or their embedding rows when the collation looked them up already (`input_rows`)."""
    return {"input_ids": input_ids} if input_rows is None else {"inputs_embeds": input_rows}


def _labels(rows: Sequence[TokenizedRowLike], pin: bool) -> torch.Tensor | None:
    """(n,) bool of the rows' `desirable` labels (unpaired preference rows), or None when the rows have none."""
    labels = [getattr(row, "desirable", None) for row in rows]
    if all(label is None for label in labels):
        return None
    if any(label is None for label in labels):
        raise DataError("a batch mixes rows with and without a desirable label", "batch the rows of one data set")
    return _pinned(torch.tensor(labels, dtype=torch.bool), pin)


def _concatenated(sequences: Sequence[Sequence[int]], total: int) -> torch.Tensor:
    """The int64 tensor of the sequences end to end (numpy reads Python ints much faster than torch)."""
    return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=total))


def collate_packed(rows: Sequence[TokenizedRowLike], *, pin_memory: bool = False) -> PackedBatch:
    """Pack rows end to end into one row and compute the sequence metadata.

    Args:
        rows: tokenized rows (`input_ids`, `labels`), each non-empty.
        pin_memory: put the tensors in pinned host memory so `PackedBatch.to("cuda")` copies asynchronously.

    Returns:
        A `PackedBatch` on the CPU.

    Raises:
        DataError: an empty batch, an empty row, or labels that do not match the ids in length.
    """
    if not rows:
        raise DataError("cannot build a batch from no rows", "the packing planner must give each batch a row")
    for index, row in enumerate(rows):
        _check_row(index, row)
    # Whole-batch tensor ops instead of per-token Python: the trainer collates on a background thread while the
    # main thread launches the step's kernels, and per-token Python would hold the interpreter lock meanwhile.
    seq_lens = [len(row.input_ids) for row in rows]
    total = sum(seq_lens)
    ids = _concatenated([row.input_ids for row in rows], total)
    labels = _concatenated([row.labels for row in rows], total)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=cu[1:])
    # targets[t] = ids[t + 1] where labels[t + 1] is trained; never across a boundary (each row's last token)
    targets = torch.full((total,), IGNORE_INDEX, dtype=torch.int64)
    targets[:-1] = torch.where(labels[1:] != IGNORE_INDEX, ids[1:], IGNORE_INDEX)
    targets[cu[1:] - 1] = IGNORE_INDEX
    positions = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(cu[:-1], lens)
    trained = torch.nonzero(targets != IGNORE_INDEX).flatten()
    return PackedBatch(
        input_ids=_pinned(ids.view(1, total), pin_memory),
        position_ids=_pinned(positions.view(1, total), pin_memory),
        targets=_pinned(targets.view(1, total), pin_memory),
        seq_lens=seq_lens,
        cu_seqlens=_pinned(cu.to(torch.int32), pin_memory),
        max_seqlen=max(seq_lens),
        num_tokens=total,
        num_trained=trained.numel(),
        trained_positions=_pinned(trained, pin_memory),
        desirable=_labels(rows, pin_memory),
    )


@dataclass
class PaddedBatch:
    """Rows padded on the right to the longest one (used when packing is switched off).

    Attributes:
        input_ids: (B, L) int64, padded with `pad_id`.
        attention_mask: (B, L) int64, 1 on real tokens, 0 on padding.
        position_ids: (B, L) int64, 0..len-1 on each row (padding continues the count; it is masked anyway).
        targets: (B, L) int64 next-token targets per row; -100 at each row's last real token and on padding.
        seq_lens: real length of each row.
        max_seqlen: L, a Python int.
        num_tokens: real tokens (sum of `seq_lens`), not counting padding.
        num_trained: positions with `targets != -100`.
        trained_positions: (num_trained,) int64 flat indices into the (B * L) positions of those targets.
        input_rows: (B, L, H) input-embedding rows gathered on the host (as `PackedBatch.input_rows`).
        desirable: (B,) bool, each row's label where the rows carry one (as `PackedBatch.desirable`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    seq_lens: list[int]
    max_seqlen: int
    num_tokens: int
    num_trained: int
    trained_positions: torch.Tensor | None = None
    input_rows: torch.Tensor | None = None
    desirable: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> PaddedBatch:
        """The same batch on `device`; tensors are copied without blocking (pinned memory to CUDA)."""
        device = torch.device(device)
        moved = {
            f.name: _move(getattr(self, f.name), device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    def model_inputs(self) -> dict:
        """Keyword arguments for `model(**...)`: ids (or their rows), the padding mask and positions."""
        return {
            **_token_inputs(self.input_ids, self.input_rows),
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "use_cache": False,
        }


def collate_padded(rows: Sequence[TokenizedRowLike], *, pad_id: int, pin_memory: bool = False) -> PaddedBatch:
    """Pad rows on the right to the longest one.

    Args:
        rows: tokenized rows (`input_ids`, `labels`), each non-empty.
        pad_id: token id written into padding positions (never trained, masked out of attention).
        pin_memory: put the tensors in pinned host memory so `PaddedBatch.to("cuda")` copies asynchronously.

    Raises:
        DataError: an empty batch, an empty row, or labels that do not match the ids in length.
    """
    if not rows:
        raise DataError("cannot build a batch from no rows", "the batch planner must give each batch a row")
    for index, row in enumerate(rows):
        _check_row(index, row)
    seq_lens = [len(row.input_ids) for row in rows]
    width = max(seq_lens)
    ids, mask, targets = [], [], []
    for row, n in zip(rows, seq_lens, strict=True):
        pad = width - n
        ids.append(list(row.input_ids) + [pad_id] * pad)
        mask.append([1] * n + [0] * pad)
        targets.append(shifted_targets(row.input_ids, row.labels) + [IGNORE_INDEX] * pad)
    trained = [
        r * width + i for r, row_targets in enumerate(targets) for i, t in enumerate(row_targets) if t != IGNORE_INDEX
    ]
    positions = torch.arange(width, dtype=torch.int64).expand(len(rows), width).contiguous()
    return PaddedBatch(
        input_ids=_pinned(torch.tensor(ids, dtype=torch.int64), pin_memory),
        attention_mask=_pinned(torch.tensor(mask, dtype=torch.int64), pin_memory),
        position_ids=_pinned(positions, pin_memory),
        targets=_pinned(torch.tensor(targets, dtype=torch.int64), pin_memory),
        seq_lens=seq_lens,
        max_seqlen=width,
        num_tokens=sum(seq_lens),
        num_trained=len(trained),
        trained_positions=_pinned(torch.tensor(trained, dtype=torch.int64), pin_memory),
        desirable=_labels(rows, pin_memory),
    )

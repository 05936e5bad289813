"""Packed and padded batches: metadata built on the CPU, shifted targets, and losses equal to running each
sequence on its own."""

from __future__ import annotations

import pytest
import torch

from hone.core.data.collate import PackedBatch, PaddedBatch, collate_packed, collate_padded
from hone.core.errors import DataError
from tests.helpers.packed import (
    Row,
    assert_grads_close,
    grads,
    model_of,
    per_sequence_loss,
    random_rows,
)

ROWS = [
    Row([11, 12, 13, 14], [-100, -100, 13, 14]),
    Row([21, 22], [21, 22]),
    Row([31, 32, 33], [-100, 32, -100]),
]


def test_packed_metadata_is_built_on_cpu_with_shifted_targets():
    batch = collate_packed(ROWS)
    assert batch.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 31, 32, 33]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]
    # target at t = next token of the same sequence when that token is labelled; -100 at each sequence's end
    assert batch.targets.tolist() == [[-100, 13, 14, -100, 22, -100, 32, -100, -100]]
    assert batch.seq_lens == [4, 2, 3]
    assert batch.cu_seqlens.tolist() == [0, 4, 6, 9]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.input_ids.dtype == batch.position_ids.dtype == batch.targets.dtype == torch.int64
    assert isinstance(batch.max_seqlen, int) and batch.max_seqlen == 4
    assert batch.num_tokens == 9
    assert batch.num_trained == 4
    assert batch.trained_positions.tolist() == [1, 2, 4, 6]
    inputs = batch.model_inputs()
    assert inputs["cu_seq_lens_q"] is batch.cu_seqlens and inputs["max_length_k"] == 4
    assert inputs["use_cache"] is False


def test_packed_batches_of_random_rows_match_the_per_token_definition():
    """The packed collation computes whole-batch tensors; every field matches the definition written token by
    token (shifted_targets per row), over rows of one token, all-trained and all-untrained rows."""
    from hone.core.data.collate import IGNORE_INDEX, shifted_targets

    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        rows = []
        for _ in range(int(torch.randint(1, 9, (1,), generator=g))):
            n = int(torch.randint(1, 40, (1,), generator=g))
            ids = torch.randint(0, 1000, (n,), generator=g).tolist()
            keep = torch.rand(n, generator=g) < float(torch.rand(1, generator=g))
            rows.append(Row(ids, [t if k else IGNORE_INDEX for t, k in zip(ids, keep.tolist(), strict=True)]))
        batch = collate_packed(rows)
        targets = [t for row in rows for t in shifted_targets(row.input_ids, row.labels)]
        assert batch.input_ids.tolist() == [[t for row in rows for t in row.input_ids]]
        assert batch.position_ids.tolist() == [[i for row in rows for i in range(len(row.input_ids))]]
        assert batch.targets.tolist() == [targets]
        assert batch.trained_positions.tolist() == [i for i, t in enumerate(targets) if t != IGNORE_INDEX]
        assert batch.num_trained == batch.trained_positions.numel()
        lengths = [len(row.input_ids) for row in rows]
        assert batch.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        assert batch.max_seqlen == max(lengths) and batch.num_tokens == sum(lengths)


def test_padded_batch_pads_right_and_shifts_per_row():
    batch = collate_padded(ROWS, pad_id=0)
    assert batch.input_ids.tolist() == [[11, 12, 13, 14], [21, 22, 0, 0], [31, 32, 33, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert batch.targets.tolist() == [[-100, 13, 14, -100], [22, -100, -100, -100], [32, -100, -100, -100]]
    assert batch.num_tokens == 9 and batch.num_trained == 4 and batch.max_seqlen == 4
    assert batch.trained_positions.tolist() == [1, 2, 4, 8]
    assert set(batch.model_inputs()) == {"input_ids", "attention_mask", "position_ids", "use_cache"}


@pytest.mark.parametrize("collate", [collate_packed, lambda rows: collate_padded(rows, pad_id=0)])
def test_bad_rows_are_reported_by_index(collate):
    with pytest.raises(DataError, match="row 1 has no tokens"):
        collate([ROWS[0], Row([], [])])
    with pytest.raises(DataError, match="row 0 has 2 input_ids but 1 labels"):
        collate([Row([1, 2], [1])])
    with pytest.raises(DataError, match="no rows"):
        collate([])


def test_to_moves_every_tensor_and_keeps_cpu_metadata():
    batch = collate_packed(ROWS)
    moved = batch.to("meta")
    assert isinstance(moved, PackedBatch)
    assert all(
        t.device.type == "meta"
        for t in (moved.input_ids, moved.position_ids, moved.targets, moved.cu_seqlens, moved.trained_positions)
    )
    assert moved.max_seqlen == 4 and moved.seq_lens == [4, 2, 3] and moved.num_trained == 4
    padded = collate_padded(ROWS, pad_id=0).to("meta")
    assert isinstance(padded, PaddedBatch) and padded.attention_mask.device.type == "meta"


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-dense", "tiny-mistral-swa"])
def test_packed_loss_equals_sequences_run_one_by_one(shape):
    """transformers' own SDPA path on a packed row (it reads sequence starts from position_ids); the
    sliding-window model has rows longer than its 8-token window."""
    from hone.core.train.loss import loss_sum

    model = model_of(shape)
    rows = random_rows([13, 5, 21, 9])
    batch = collate_packed(rows)

    want = per_sequence_loss(model, rows)
    want.backward()
    want_grads = grads(model)
    model.zero_grad()
    got = loss_sum(model, batch, mode="plain")
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    assert_grads_close(grads(model), want_grads)


def test_padded_loss_equals_packed_loss():
    from hone.core.train.loss import loss_sum

    model = model_of("tiny-llama")
    rows = random_rows([7, 12, 3], seed=1)
    packed = loss_sum(model, collate_packed(rows), mode="plain")
    padded = loss_sum(model, collate_padded(rows, pad_id=0), mode="plain")
    torch.testing.assert_close(padded, packed, rtol=1e-5, atol=1e-5)

"""Long rows by spans (hone.core.speed.attention.long_rows) on the CPU: the spans of a batch, the bucket lengths, and
outputs and every gradient equal to each sequence attended alone, through both ways a bucket is filled (the next
sequence's tokens, zeros at the batch's end), with grouped heads passed or expanded. On the CPU the dense kernel is
SDPA's own choice and the short runs go through a per-row reference; the GPU file checks cuDNN and varlen."""

from __future__ import annotations

import functools

import pytest
import torch

from hone.core.data.batch_lengths import register_batch
from hone.core.speed.attention import backends, long_rows
from hone.core.speed.attention.long_rows import LongRows, bucket, build_spans
from tests.helpers.packed import rows_attention


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _rows_attend(q, k, v, cu, max_len, scale=None):
    """Short runs on the CPU: each row alone (reads the offsets: fine off a GPU)."""
    return rows_attention(q, k, v, cu, scale)


def _reference(q, k, v, lengths):
    mask = backends.block_causal_mask(_cu(lengths), sum(lengths))
    return backends.dense_sink_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), mask, None)[0]


def test_bucket_lengths_round_up_to_a_step_that_grows_with_the_length():
    assert bucket(1) == 256 and bucket(256) == 256 and bucket(257) == 512
    assert bucket(16384) == 16384 and bucket(16385) == 16384 + 512
    assert bucket(32768 + 1) == 32768 + 1024
    for n in (300, 5000, 16500, 30000, 70000):
        assert n <= bucket(n) <= n * (1 + 1 / 16) + 256


def test_spans_keep_short_runs_together_and_give_each_long_sequence_its_own():
    lengths = [3, 10, 2, 12, 4]
    cu = _cu(lengths)
    spans = build_spans(cu, lengths, threshold=10)
    assert [(s.start, s.end, s.long, s.max_len) for s in spans] == [
        (0, 3, False, 3),
        (3, 13, True, 10),
        (13, 15, False, 2),
        (15, 27, True, 12),
        (27, 31, False, 4),
    ]
    assert spans[0].cu_seqlens.tolist() == [0, 3] and spans[2].cu_seqlens.tolist() == [0, 2]
    assert spans[1].padded == 256
    assert build_spans(cu, lengths, threshold=13) is None  # nothing long: one varlen call


def test_spans_are_built_once_per_registered_batch_and_unknown_batches_get_none():
    lengths = [300, 20]
    cu = _cu(lengths)
    assert long_rows.spans(cu, 100) is None
    register_batch(cu, lengths)
    first = long_rows.spans(cu, 100)
    assert first is long_rows.spans(cu, 100)
    assert [s.long for s in first] == [True, False]
    assert long_rows.spans(cu, 1000) is None


@pytest.mark.parametrize(
    "how",
    [LongRows(64, cudnn=False), LongRows(64, gqa_flag=False, cudnn=False), LongRows(64, contiguous=True, cudnn=False)],
    ids=lambda h: h.tag(),
)
@pytest.mark.parametrize(
    "lengths", [[7, 300, 5, 260, 9], [300, 70], [70, 300], [300]], ids=["mixed", "long-first", "long-last", "one"]
)
def test_output_and_gradients_equal_each_sequence_alone(lengths, how):
    torch.manual_seed(0)
    total, heads, kv_heads, dim = sum(lengths), 4, 2, 8
    q, k, v = (torch.randn(total, h, dim, dtype=torch.float64, requires_grad=True) for h in (heads, kv_heads, kv_heads))
    spans = build_spans(_cu(lengths), lengths, how.threshold)
    out = long_rows.attention(q, k, v, _cu(lengths), spans, None, _rows_attend, how)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = _reference(*leaves, lengths)
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    for got, leaf in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(got.grad, leaf.grad)


@pytest.mark.parametrize("length", [256, 300], ids=["on-a-bucket", "padded"])
def test_a_batch_of_one_long_row_returns_the_kernels_own_output(monkeypatch, length):
    """One row is the whole batch: the output is the kernel's (the one it keeps for backward), not a copy beside it,
    with and without autograd, and gradients as before. cuDNN lays its output out token-major, as faked here."""
    original = long_rows.dense_causal
    pieces = []

    def token_major(*args):
        piece = original(*args).contiguous()
        pieces.append(piece)
        return piece

    monkeypatch.setattr(long_rows, "dense_causal", token_major)
    torch.manual_seed(3)
    how = LongRows(64, cudnn=False)
    q, k, v = (torch.randn(length, h, 8, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    spans = build_spans(_cu([length]), [length], how.threshold)
    with torch.no_grad():
        plain = long_rows.attention(q, k, v, _cu([length]), spans, None, _rows_attend, how)
    assert plain.data_ptr() == pieces[-1].data_ptr() and plain.shape == q.shape
    out = long_rows.attention(q, k, v, _cu([length]), spans, None, _rows_attend, how)
    assert out.data_ptr() == pieces[-1].data_ptr() and out.shape == q.shape
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = _reference(*leaves, [length])
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(plain, ref.detach())
    for got, leaf in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(got.grad, leaf.grad)
    k.grad = v.grad = None  # and with the query frozen: only key and value get a gradient
    long_rows.attention(q.detach(), k, v, _cu([length]), spans, None, _rows_attend, how).backward(grad_out)
    torch.testing.assert_close(k.grad, leaves[1].grad)
    torch.testing.assert_close(v.grad, leaves[2].grad)


def test_without_autograd_and_with_only_key_value_trained():
    torch.manual_seed(1)
    lengths, how = [100, 6, 90], LongRows(64, cudnn=False)
    q = torch.randn(196, 2, 8, dtype=torch.float64)
    k, v = (torch.randn(196, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    spans = build_spans(_cu(lengths), lengths, how.threshold)
    with torch.no_grad():
        plain = long_rows.attention(q, k, v, _cu(lengths), spans, None, _rows_attend, how)
    torch.testing.assert_close(plain, _reference(q, k, v, lengths))
    out = long_rows.attention(q, k, v, _cu(lengths), spans, 0.3, functools.partial(_rows_attend, scale=0.3), how)
    out.sum().backward()
    leaves = [k.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()]
    mask = backends.block_causal_mask(_cu(lengths), 196)
    ref = backends.dense_sink_attention(*(t.transpose(0, 1)[None] for t in (q, *leaves)), mask, None, 0.3)[0]
    ref.sum().backward()
    torch.testing.assert_close(k.grad, leaves[0].grad)
    torch.testing.assert_close(v.grad, leaves[1].grad)


def test_a_checkpointed_layer_keeps_its_attention_for_the_backward_and_attends_once(monkeypatch):
    """The first (no-grad) forward of a checkpointed layer keeps its spans' graphs in the batch's memo; the
    recompute in backward takes them, runs no kernel, and the gradients are those of attention run once."""
    from hone.core.speed.checkpointing import layer_recompute

    monkeypatch.setattr(long_rows, "_room_to_keep", lambda q, k, v: True)
    calls = []
    original = long_rows._run
    monkeypatch.setattr(long_rows, "_run", lambda span, *a: calls.append(span.long) or original(span, *a))
    torch.manual_seed(2)
    lengths, how, module = [100, 6, 90, 3], LongRows(64, cudnn=False, keep=True), torch.nn.Identity()
    cu = _cu(lengths)
    register_batch(cu, lengths)
    spans = long_rows.spans(cu, how.threshold)
    q, k, v = (torch.randn(199, h, 8, dtype=torch.float64) for h in (4, 2, 2))
    with torch.no_grad(), layer_recompute._first_forward():
        first = long_rows.attention(q, k, v, cu, spans, None, _rows_attend, how, module)
    assert len(calls) == len(spans) == 4
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with layer_recompute._replayed(layer_recompute._capture_state(torch.device("cpu"))):
        again = long_rows.attention(*leaves, cu, spans, None, _rows_attend, how, module)
    assert len(calls) == 4  # the recompute attended nothing
    torch.testing.assert_close(again, first)
    grad_out = torch.randn_like(again)
    again.backward(grad_out)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _reference(*ref_leaves, lengths).backward(grad_out)
    for got, want in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    assert ("kept attention", id(module)) not in long_rows._memo(cu)  # taken, not left behind

    # Without room, or outside a checkpointed forward, nothing is kept and the recompute attends again.
    monkeypatch.setattr(long_rows, "_room_to_keep", lambda q, k, v: False)
    with torch.no_grad(), layer_recompute._first_forward():
        long_rows.attention(q, k, v, cu, spans, None, _rows_attend, how, module)
    assert ("kept attention", id(module)) not in long_rows._memo(cu)
    calls.clear()
    with layer_recompute._replayed(layer_recompute._capture_state(torch.device("cpu"))):
        long_rows.attention(
            *[t.clone().requires_grad_() for t in (q, k, v)], cu, spans, None, _rows_attend, how, module
        )
    assert len(calls) == 4


def test_kept_bytes_counts_inputs_output_and_log_sum_exp():
    q, k, v = torch.empty(10, 4, 8, dtype=torch.bfloat16), torch.empty(10, 2, 8), torch.empty(10, 2, 8)
    assert long_rows.kept_bytes(q, k.bfloat16(), v.bfloat16()) == (320 + 160 + 160 + 320) * 2 + 10 * 4 * 4
    assert not long_rows._room_to_keep(q, k, v)  # never on a CPU


def test_a_layer_keeps_its_attention_only_with_room_for_the_backward_under_the_process_limit():
    gib = 2**30
    # Qwen3-8B at 65,536 tokens keeps 1.26 GiB a layer: beside 20 GiB on an 80 GiB card it has room.
    assert long_rows.room_to_keep(20 * gib, 1.26 * gib, 80 * gib)
    # At 262,144 tokens (5 GiB kept, ~30 GiB for the backward) half of an 80 GiB card is passed after the weights.
    assert not long_rows.room_to_keep(15 * gib, 5.03 * gib, 80 * gib)
    # The same layer on a card of 141 GiB, with nothing capped, still keeps.
    assert long_rows.room_to_keep(15 * gib, 5.03 * gib, 141 * gib)
    assert not long_rows.room_to_keep(69.5 * gib, 0.1 * gib, 140 * gib)  # never past half of the limit


def test_the_limit_is_the_share_a_capped_process_may_allocate(monkeypatch):
    class Properties:
        total_memory = 140 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 80 / 140)
    assert long_rows.process_memory_limit(torch.device("cuda", 0)) == 80 * 2**30

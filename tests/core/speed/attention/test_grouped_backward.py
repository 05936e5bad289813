"""Packed attention back-propagated a group of whole sequences at a time gives the gradients of one whole backward.

The grouping and the gradient assembly are checked on the CPU with a plain-torch varlen attention standing in for
torch's flash kernel (CUDA only); tests/core/speed/attention/test_attention_gpu.py runs the real kernel."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from hone.core.data.batch_lengths import register_batch
from hone.core.speed.attention import grouped_backward
from hone.core.speed.attention.grouped_backward import GroupedBackwardAttention, attention, group_tokens

LENGTHS = [23, 41, 9, 30, 5]


def reference_attend(calls: list):
    """Causal attention within each sequence of a varlen (T, H, D) batch, grouped-query heads expanded."""

    def attend(q, k, v, cu, max_len):
        calls.append(q.shape[0])
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        bounds = cu.tolist()
        outs = [
            F.scaled_dot_product_attention(
                q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True
            ).transpose(0, 1)
            for a, b in itertools.pairwise(bounds)
        ]
        return torch.cat(outs)

    return attend


@pytest.fixture
def small_groups(monkeypatch):
    """Groups of at most 40 tokens: [23] [41] (alone: longer than a group) [9, 30] [5]."""
    monkeypatch.setattr(grouped_backward, "MIN_GROUP_TOKENS", 1)
    monkeypatch.setattr(grouped_backward, "WORKSPACE_BYTES", 40 * 4 * 8 * 8)


def _inputs(heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)
    q, k, v = (
        torch.randn(total, h, dim, generator=gen, dtype=torch.float64, requires_grad=True)
        for h in (heads, kv_heads, kv_heads)
    )
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    register_batch(cu, LENGTHS)
    return q, k, v, cu, torch.randn(total, heads, dim, generator=gen, dtype=torch.float64)


def test_grouped_backward_equals_one_whole_backward(small_groups):
    assert group_tokens(4, 8) == 40
    q, k, v, cu, grad = _inputs()
    calls: list[int] = []
    attend = reference_attend(calls)
    want = attend(q, k, v, cu, max(LENGTHS))
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    calls.clear()
    got = attention(q, k, v, cu, max(LENGTHS), attend)
    assert got.grad_fn is not None and type(got.grad_fn).__name__ == "GroupedBackwardAttentionBackward"
    got_grads = torch.autograd.grad(got, (q, k, v), grad)
    assert calls == [sum(LENGTHS), 23, 41, 39, 5], "one whole forward, then one forward per group in backward"
    torch.testing.assert_close(got, want)
    for name, g, w in zip("qkv", got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, msg=f"d{name}")


def test_whole_where_grouping_cannot_help_or_apply(small_groups, monkeypatch):
    q, k, v, cu, _ = _inputs()
    calls: list[int] = []
    attend = reference_attend(calls)
    with torch.no_grad():  # a checkpointed layer's forward: nothing to back-propagate
        attention(q, k, v, cu, max(LENGTHS), attend)
    assert (
        attention(q, k, v, cu.clone(), max(LENGTHS), attend).grad_fn.__class__.__name__
        != "GroupedBackwardAttentionBackward"
    ), "a batch the packer did not register runs whole"
    monkeypatch.setattr(grouped_backward, "WORKSPACE_BYTES", 10**9)  # one group would hold every token
    out = attention(q, k, v, cu, max(LENGTHS), attend)
    assert not isinstance(out.grad_fn, GroupedBackwardAttention._backward_cls)

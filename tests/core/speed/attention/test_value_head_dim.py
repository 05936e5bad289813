"""Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash) on the varlen path: v's head dim is smaller than q/k's,
which flash kernels do not take. `backends._varlen` pads v and cuts the output back; checked on the CPU with a
stand-in for torch's varlen kernel that, like the flash kernel, refuses mixed head dims."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.varlen

from hone.core.speed.attention import backends
from tests.helpers.packed import rows_attention


def _flash_like(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=None, enable_gqa=False, **_):
    assert q.shape[-1] == k.shape[-1] == v.shape[-1], "the flash kernel takes one head dim for q, k and v"
    assert window_size == (-1, 0)
    return rows_attention(q, k, v, cu_q, scale)


def test_values_narrower_than_queries_are_padded_for_the_kernel_and_cut_back(monkeypatch):
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", _flash_like)
    torch.manual_seed(0)
    lengths = [5, 11, 3]
    total, heads, kv_heads, qk_dim, v_dim = sum(lengths), 4, 2, 24, 16
    cu = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    q, k, v = (
        torch.randn(1, h, total, d, dtype=torch.float64, requires_grad=True)
        for h, d in ((heads, qk_dim), (kv_heads, qk_dim), (kv_heads, v_dim))
    )
    options = backends.VarlenOptions(window=True, gqa_flag=True)
    out = backends._varlen(q, k, v, cu, max(lengths), 0.2, None, options=options)
    assert out.shape == (total, heads, v_dim)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = backends.dense_sink_attention(*leaves, backends.block_causal_mask(cu, total), None, 0.2)[0]
    ref.backward(grad_out)
    torch.testing.assert_close(out, ref)
    for got, want in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_values_wider_than_queries_are_refused():
    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="larger than the query"):
        backends._varlen(
            q,
            k,
            torch.zeros(1, 2, 4, 16),
            torch.tensor([0, 4], dtype=torch.int32),
            4,
            None,
            None,
            options=backends.VarlenOptions(window=True, gqa_flag=True),
        )

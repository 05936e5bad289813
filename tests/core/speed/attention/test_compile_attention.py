"""Hone's packed attention inside `torch.compile`: traced once, reused by every layer and every call.

The first H200 run hit dynamo's recompile limit in every compiled decoder block: a Python counter bumped inside
the attention function is, to dynamo, a constant it guards on. The CUDA `varlen_attn` kernel is not available on
a CPU, so it is replaced here by the same packed causal attention computed with SDPA and a block mask; the
function under test (`varlen_attention`: metadata from kwargs, fallback checks, counting) is the real one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter

from hone.core.speed.attention import backends


def _sdpa_varlen(query, key, value, cu, max_len, scaling, window, sinks=None, options=None, module=None):
    """(B, H, T, D) query/key/value -> (B * T, H, D), like torch's varlen_attn, for the CPU (no sinks here)."""
    assert sinks is None
    total = query.shape[2]
    mask = backends.block_causal_mask(cu, total, window)
    groups = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(
        query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1), attn_mask=mask, scale=scaling
    )
    return out.transpose(1, 2).reshape(total, query.shape[1], query.shape[3])


class _Attention(torch.nn.Module):
    is_causal = True

    def forward(self, query, key, value, cu, max_len):
        return backends.varlen_attention(
            self,
            query,
            key,
            value,
            None,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=max_len,
            max_length_k=max_len,
            scaling=0.25,
        )[0]


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 12, 16, generator=g)
    k = torch.randn(1, 2, 12, 16, generator=g)
    v = torch.randn(1, 2, 12, 16, generator=g)
    return q, k, v


def test_varlen_attention_traces_once_for_every_call(monkeypatch):
    monkeypatch.setattr(backends, "_varlen", _sdpa_varlen)
    module = _Attention()
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(module, backend=counter)
    backends.reset_stats()
    for seed in range(6):  # six layers of one batch
        q, k, v = _inputs(seed)
        torch.testing.assert_close(compiled(q, k, v, cu, 7), module(q, k, v, cu, 7))
    assert counter.frame_count == 1, f"dynamo compiled the attention {counter.frame_count} times for 6 calls"
    assert backends.STATS.packed_calls == 6, "the eager calls are still counted"
    torch._dynamo.reset()

"""In-place rotary embedding against transformers' `apply_rotary_pos_emb`, run by Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.reference import rope_reference
from hone.kernels.rope import apply_rotary

TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}
# (batch, seq, q heads, kv heads, head_dim, cos batch): one token, GQA with odd head counts, a head_dim whose
# half is not a power of two, per-row cos/sin, a long row.
SHAPES = [(1, 1, 4, 2, 16, 1), (2, 7, 3, 1, 24, 2), (1, 9, 8, 8, 64, 1), (1, 300, 2, 1, 32, 1)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _packed_positions(batch: int, seq: int) -> torch.Tensor:
    """Rows of several packed sequences: positions restart at 0 at each boundary."""
    rows = []
    for b in range(batch):
        lengths, left = [], seq
        while left:
            lengths.append(min(left, 3 + 2 * b + len(lengths)))
            left -= lengths[-1]
        rows.append(torch.cat([torch.arange(n) for n in lengths]))
    return torch.stack(rows)


def _cos_sin(positions: torch.Tensor, head_dim: int, dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _projections(batch, seq, heads, head_dim, dtype, unsqueeze_dim, generator):
    """q or k as attention builds them: a (B, S, H*D) projection viewed per head (and transposed)."""
    flat = torch.randn(batch, seq, heads * head_dim, generator=generator).to(dtype).requires_grad_()
    view = (flat * 1).view(batch, seq, heads, head_dim)
    return flat, (view.transpose(1, 2) if unsqueeze_dim == 1 else view)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("batch", "seq", "hq", "hk", "head_dim", "cos_batch"), SHAPES)
def test_rope_matches_reference_in_place(batch, seq, hq, hk, head_dim, cos_batch, dtype, unsqueeze_dim):
    positions = _packed_positions(batch, seq)[:cos_batch]
    cos, sin = _cos_sin(positions, head_dim, dtype)
    results = {}
    for name, fn in (("kernel", apply_rotary), ("reference", rope_reference)):
        g = torch.Generator().manual_seed(0)
        q_flat, q = _projections(batch, seq, hq, head_dim, dtype, unsqueeze_dim, g)
        k_flat, k = _projections(batch, seq, hk, head_dim, dtype, unsqueeze_dim, g)
        q_out, k_out = fn(q, k, cos, sin, unsqueeze_dim)
        if name == "kernel":
            assert q_out is q and k_out is k, "the Triton path rotates q and k in place (the reference copies)"
        dq = torch.randn(q_out.shape, generator=g).to(dtype)
        dk = torch.randn(k_out.shape, generator=g).to(dtype)
        grads = torch.autograd.grad((q_out, k_out), (q_flat, k_flat), (dq, dk))
        results[name] = (q_out.detach(), k_out.detach(), *grads)
    for got, want, what in zip(results["kernel"], results["reference"], ("q", "k", "dq", "dk"), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype], msg=lambda m, w=what: f"{w} {dtype}: {m}")


def test_rope_without_grad_rotates_in_place():
    cos, sin = _cos_sin(torch.arange(5)[None], 16, torch.float32)
    q = torch.randn(1, 2, 5, 16)
    k = torch.randn(1, 1, 5, 16)
    q_ref, k_ref = rope_reference(q, k, cos, sin)
    q_ptr, k_ptr = q.data_ptr(), k.data_ptr()
    with torch.no_grad():
        q_out, k_out = apply_rotary(q, k, cos, sin)
    assert q_out.data_ptr() == q_ptr and k_out.data_ptr() == k_ptr
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(k, k_ref)


def test_unsupported_layout_falls_back_to_the_reference():
    """A head dimension that is not contiguous is not the kernel's case: the reference runs, out of place."""
    q = torch.randn(1, 2, 4, 32)[..., ::2]
    k = torch.randn(1, 1, 4, 32)[..., ::2]
    cos, sin = _cos_sin(torch.arange(4)[None], 16, torch.float32)
    q_out, k_out = apply_rotary(q, k, cos, sin)
    q_ref, k_ref = rope_reference(q, k, cos, sin)
    assert q_out is not q
    torch.testing.assert_close(q_out, q_ref, atol=0, rtol=0)
    torch.testing.assert_close(k_out, k_ref, atol=0, rtol=0)

"""The router's fused softmax + top-k (`hone.kernels.moe.router`) under Triton's interpreter against transformers' eager
formula (`router_top_k_reference`, float32 autograd): weights, expert ids and the logits' gradient."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.moe.router import (
    RouterTopKFunction,
    router_top_k,
    router_top_k_backward,
    router_top_k_forward,
    router_top_k_reference,
)

TOL = {
    torch.float32: dict(atol=2e-6, rtol=2e-5),
    torch.bfloat16: dict(atol=8e-3, rtol=1.6e-2),
    torch.float16: dict(atol=1e-3, rtol=2e-3),
}


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _logits(rows: int, experts: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # distinct values per row even in 16 bits (no ties, which the two orders may break differently): multiples of
    # 1/8 below 2^8 / 8 are exact in bf16
    ranks = torch.stack([torch.randperm(experts, generator=g) for _ in range(rows)])
    return ((ranks - experts / 2) / 8).to(dtype)


def _truth(logits: torch.Tensor, top_k: int, normalize: bool, d_weights: torch.Tensor):
    leaf = logits.float().requires_grad_(True)
    weights, index = router_top_k_reference(leaf, top_k, normalize)
    (weights * d_weights.float()).sum().backward()
    return weights.detach(), index, leaf.grad


# prime expert counts, k = 1 and k = E, a router of 128 experts with top-8 as Qwen3-30B-A3B has
CASES = [(37, 7, 1, True), (37, 7, 7, True), (37, 7, 3, False), (5, 128, 8, True), (70, 60, 4, True), (3, 2, 2, False)]


@pytest.mark.parametrize(("rows", "experts", "top_k", "normalize"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_and_backward_match_the_eager_router(rows, experts, top_k, normalize, dtype):
    logits = _logits(rows, experts, dtype)
    d_weights = torch.randn(rows, top_k, generator=torch.Generator().manual_seed(1)).to(dtype)
    want_w, want_i, want_d = _truth(logits, top_k, normalize, d_weights)

    weights, index = router_top_k_forward(logits, top_k, normalize)
    assert index.dtype == torch.int64 and weights.dtype == dtype
    assert torch.equal(index, want_i)
    torch.testing.assert_close(weights.float(), want_w.to(dtype).float(), **TOL[dtype])

    d_logits = router_top_k_backward(logits, index, d_weights, normalize)
    assert d_logits.dtype == dtype
    scale = max(want_d.abs().max().item(), 1.0)  # top-1 renormalized: the true gradient is 0
    torch.testing.assert_close(d_logits.float() / scale, want_d / scale, **TOL[dtype])


def test_entry_builds_an_autograd_node_and_takes_strided_gradients():
    logits = _logits(9, 16, torch.float32).requires_grad_(True)
    weights, index = router_top_k(logits, 4, True)
    assert weights.grad_fn is not None and "RouterTopK" in type(weights.grad_fn).__name__
    assert not index.requires_grad
    d_weights = torch.randn(4, 9).T  # a transposed (non-contiguous) incoming gradient
    (weights * d_weights).sum().backward()
    _, _, want = _truth(logits.detach(), 4, True, d_weights)
    torch.testing.assert_close(logits.grad, want, **TOL[torch.float32])


def test_ties_pick_the_lower_expert_and_padding_rows_are_not_written():
    logits = torch.zeros(3, 6)
    logits[:, 4] = 1.0
    weights, index = router_top_k_forward(logits, 3, False)
    assert index.tolist() == [[4, 0, 1]] * 3
    torch.testing.assert_close(weights.sum(-1), torch.softmax(logits, -1)[:, [4, 0, 1]].sum(-1))


def test_bad_top_k_and_the_reference_fallback(monkeypatch):
    with pytest.raises(ValueError, match="top_k = 9"):
        router_top_k(torch.zeros(2, 8), 9, True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # no Triton on CPU tensors: the eager formula itself
    logits = _logits(4, 8, torch.float32).requires_grad_(True)
    weights, _ = router_top_k(logits, 2, True)
    assert weights.grad_fn is not None and not isinstance(weights.grad_fn, RouterTopKFunction)

"""The experts' fused silu gate (`hone.kernels.moe.glu`) under Triton's interpreter, against float32 autograd of
`silu(gate) * up` and against its own torch form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hone.kernels.moe.glu import (
    swiglu_halves,
    swiglu_halves_backward,
    swiglu_halves_forward,
    swiglu_halves_grad,
    swiglu_halves_grad_reference,
)

# Relative to the largest value. bf16: the interpreter rounds toward zero (a GPU to nearest), one unit is 2^-8.
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 4e-3}
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def _float32_truth(gate_up: torch.Tensor, g: torch.Tensor, w: torch.Tensor):
    """h, d gate_up and the row dots <g, h> by float32 autograd of the eager formula."""
    leaf = gate_up.float().requires_grad_(True)
    gate, up = leaf.chunk(2, dim=-1)
    h = F.silu(gate) * up
    (h * g.float() * w.float()[:, None]).sum().backward()
    return h.detach(), leaf.grad, (g.float() * h.detach()).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("rows", "width"), [(1, 2), (5, 48), (3, 2 * 1100)])  # 1100 > one 1024-column block
def test_kernels_match_float32_autograd(rows, width, dtype):
    gen = torch.Generator().manual_seed(rows + width)
    gate_up = (3 * torch.randn(rows, width, generator=gen)).to(dtype)
    g = torch.randn(rows, width // 2, generator=gen).to(dtype)
    w = torch.rand(rows, generator=gen)
    h_truth, d_truth, dots_truth = _float32_truth(gate_up, g, w)
    h = swiglu_halves_forward(gate_up)
    h2, d_gate_up, dots = swiglu_halves_backward(gate_up, g, w)
    assert h.dtype == h2.dtype == d_gate_up.dtype == dtype and dots.dtype == torch.float32
    errors = {
        "h": _rel(h, h_truth),
        "h (backward)": _rel(h2, h_truth),
        "d gate_up": _rel(d_gate_up, d_truth),
        "row dots": _rel(dots, dots_truth),
    }
    bad = {k: f"{v:.2g}" for k, v in errors.items() if not v <= TOL[dtype]}
    assert not bad, f"{rows}x{width} {dtype}: relative errors above {TOL[dtype]}: {bad}"


def test_triton_and_torch_forms_agree_on_strided_rows():
    """gate_up as a column slice of a wider buffer (unit column stride, larger row stride)."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(6, 40, generator=gen)
    gate_up, g, w = wide[:, :32], torch.randn(6, 16, generator=gen), torch.rand(6, generator=gen)
    for got, want in zip(swiglu_halves_grad(gate_up, g, w), swiglu_halves_grad_reference(gate_up, g, w), strict=True):
        assert _rel(got, want) <= 2e-6
    assert _rel(swiglu_halves(gate_up), F.silu(gate_up[:, :16]) * gate_up[:, 16:]) <= 2e-6


def test_extreme_gates_stay_finite():
    gate_up = torch.tensor([[-1e4, -90.0, 0.0, 90.0, 1e4, 1.0, 1.0, 1.0, 1.0, 1.0]])
    h, d_gate_up, dots = swiglu_halves_backward(gate_up, torch.ones(1, 5), torch.ones(1))
    assert torch.isfinite(h).all() and torch.isfinite(d_gate_up).all() and torch.isfinite(dots).all()
    torch.testing.assert_close(h, F.silu(gate_up[:, :5]) * gate_up[:, 5:])

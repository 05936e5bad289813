"""gpt-oss's fused experts gate (`hone.kernels.moe.clamped_glu`) under Triton's interpreter: against float32 autograd
of transformers' own `_apply_gate`, clamps included, and against its own torch form."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.moe.clamped_glu import (
    ClampedGlu,
    clamped_glu,
    clamped_glu_backward,
    clamped_glu_forward,
    clamped_glu_grad,
    clamped_glu_grad_reference,
    clamped_glu_reference,
)

GATE = ClampedGlu(alpha=1.702, limit=7.0)  # gpt-oss-20b's config
# Relative to the largest value. bf16: the interpreter rounds toward zero (a GPU to nearest), one unit is 2^-8.
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 4e-3}
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def _transformers_gate(gate_up: torch.Tensor) -> torch.Tensor:
    """GptOssExperts._apply_gate as transformers 5 writes it."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=GATE.limit)
    up = up.clamp(min=-GATE.limit, max=GATE.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * GATE.alpha))


def _float32_truth(gate_up: torch.Tensor, g: torch.Tensor, w: torch.Tensor):
    leaf = gate_up.float().requires_grad_(True)
    h = _transformers_gate(leaf)
    (h * g.float() * w.float()[:, None]).sum().backward()
    return h.detach(), leaf.grad, (g.float() * h.detach()).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("rows", "width"), [(1, 2), (5, 48), (3, 2 * 1100)])  # 1100 > one 1024-column block
def test_kernels_match_float32_autograd_of_transformers_gate(rows, width, dtype):
    gen = torch.Generator().manual_seed(rows + width)
    gate_up = (6 * torch.randn(rows, width, generator=gen)).to(dtype)  # many values beyond the clamps of ±7
    g = torch.randn(rows, width // 2, generator=gen).to(dtype)
    w = torch.rand(rows, generator=gen)
    h_truth, d_truth, dots_truth = _float32_truth(gate_up, g, w)
    h = clamped_glu_forward(gate_up, GATE)
    h2, d_gate_up, dots = clamped_glu_backward(gate_up, g, w, GATE)
    assert h.dtype == h2.dtype == d_gate_up.dtype == dtype and dots.dtype == torch.float32
    errors = {
        "h": _rel(h, h_truth),
        "h (backward)": _rel(h2, h_truth),
        "d gate_up": _rel(d_gate_up, d_truth),
        "row dots": _rel(dots, dots_truth),
    }
    bad = {k: f"{v:.2g}" for k, v in errors.items() if not v <= TOL[dtype]}
    assert not bad, f"{rows}x{width} {dtype}: relative errors above {TOL[dtype]}: {bad}"


def test_the_clamps_stop_the_gradient_where_transformers_does():
    # gates below, at and above the limit; ups below -limit, inside, at +limit and above
    gate_up = torch.tensor([[-9.0, -9.0, 7.0, 0.5, 8.0, 7.0, 3.0, 9.0]])
    g, w = torch.ones(1, 4), torch.ones(1)
    _, d_truth, _ = _float32_truth(gate_up, g, w)
    _, d_gate_up, _ = clamped_glu_backward(gate_up.clone(), g, w, GATE)
    torch.testing.assert_close(d_gate_up, d_truth, rtol=1e-6, atol=1e-6)
    assert d_gate_up[0, 4] == 0 and d_gate_up[0, 1] == 0 and d_gate_up[0, 7] == 0  # gate 8, up -9, up 9: held


def test_triton_and_torch_forms_agree_on_strided_rows_and_overwrite_in_place():
    gen = torch.Generator().manual_seed(3)
    wide = 5 * torch.randn(6, 40, generator=gen)
    gate_up, g, w = wide[:, :32], torch.randn(6, 16, generator=gen), torch.rand(6, generator=gen)
    for got, want in zip(clamped_glu_grad(gate_up, g, w, GATE), clamped_glu_grad_reference(gate_up, g, w, GATE)):
        assert _rel(got, want) <= 2e-6
    assert _rel(clamped_glu(gate_up, GATE), _transformers_gate(gate_up)) <= 2e-6
    assert _rel(clamped_glu_reference(gate_up, GATE), _transformers_gate(gate_up)) <= 2e-6
    expected = clamped_glu_grad_reference(gate_up, g, w, GATE)[1]
    buffer = gate_up.clone()
    _, d_gate_up, _ = clamped_glu_backward(buffer, g, w, GATE, overwrite=True)
    assert d_gate_up.data_ptr() == buffer.data_ptr() and _rel(buffer, expected) <= 2e-6


def test_extreme_values_stay_finite():
    gate_up = torch.tensor([[-1e4, 1e4, -90.0, -90.0, 0.0, 0.0, 90.0, 90.0, 1e4, -1e4]])
    h, d_gate_up, dots = clamped_glu_backward(gate_up, torch.ones(1, 5), torch.ones(1), GATE)
    assert torch.isfinite(h).all() and torch.isfinite(d_gate_up).all() and torch.isfinite(dots).all()
    torch.testing.assert_close(h, _transformers_gate(gate_up))

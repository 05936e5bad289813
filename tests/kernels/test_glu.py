"""SwiGLU / GeGLU kernels against `act(gate) * up` in torch, run by Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.glu import glu
from hone.kernels.reference import glu_reference

# bf16: the interpreter rounds toward zero (the GPU to nearest); values reach ~30, one unit there is 0.125.
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=1e-2, rtol=4e-3),
    torch.bfloat16: dict(atol=1.3e-1, rtol=2e-2),
}
SHAPES = [(1, 1), (3, 1031), (2, 3, 77)]
# exp(-g) overflows to inf for very negative gates in the interpreter's numpy; that limit is the intended value.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_glu_matches_reference(shape, dtype, activation):
    g = torch.Generator().manual_seed(0)
    gate = (4 * torch.randn(shape, generator=g)).to(dtype).requires_grad_()  # wide range: both tails
    up = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(shape, generator=g).to(dtype)
    out = glu(gate, up, activation)
    assert type(out.grad_fn).__name__ == "GLUFunctionBackward", "the Triton path did not run"
    assert len(out.grad_fn.saved_tensors) == 2, "backward keeps gate and up only (the activation is recomputed)"
    expected = glu_reference(gate, up, activation)
    torch.testing.assert_close(out, expected, **TOL[dtype], msg=lambda m: f"{activation} {dtype} out: {m}")
    got = torch.autograd.grad(out, (gate, up), dout)
    want = torch.autograd.grad(expected, (gate, up), dout)
    for a, b, name in zip(got, want, ("dgate", "dup"), strict=True):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda m, n=name: f"{activation} {dtype} {n}: {m}")


def test_extreme_gates_stay_finite():
    gate = torch.tensor([-1e4, -90.0, -20.0, 0.0, 20.0, 90.0, 1e4], requires_grad=True)
    up = torch.ones(7, requires_grad=True)
    for activation in ("silu", "gelu_tanh", "gelu"):
        out = glu(gate, up, activation)
        dgate, dup = torch.autograd.grad(out.sum(), (gate, up))
        expected = glu_reference(gate, up, activation)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(dgate).all() and torch.isfinite(dup).all(), (activation, dgate, dup)


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="relu"):
        glu(torch.ones(3), torch.ones(3), "relu")


def test_without_grad_the_kernel_runs_without_an_autograd_node_and_gives_the_same_values():
    g = torch.Generator().manual_seed(3)
    gate, up = (torch.randn(5, 19, generator=g).requires_grad_() for _ in range(2))
    with torch.no_grad():
        direct = glu(gate, up, "silu")
    assert direct.grad_fn is None
    assert torch.equal(direct, glu(gate, up, "silu").detach())

"""RMSNorm and add+RMSNorm kernels against the transformers-equivalent reference, run by Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.reference import add_rms_norm_reference, rms_norm_reference
from hone.kernels.rms_norm import FusedRMSNorm, add_rms_norm, rms_norm

# The interpreter rounds fp32 -> bf16 toward zero (the GPU rounds to nearest), so bf16 allows two units in the
# last place of values up to ~4 (normalized rows times weights).
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=6e-2, rtol=2e-2),
}
# (leading shape, hidden): odd widths, one token, several short rows in one program, a long row.
SHAPES = [((1,), 7), ((3, 5), 33), ((9,), 128), ((2,), 4099)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _inputs(lead, hidden, dtype, style, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, hidden, generator=g).to(dtype).requires_grad_()
    centre = 0.0 if style == "gemma" else 1.0  # Gemma stores weight - 1
    w = (centre + 0.3 * torch.randn(hidden, generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(*lead, hidden, generator=g).to(dtype)
    return x, w, dy


def _grads(out, dout, *inputs):
    return torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("style", ["llama", "gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("lead", "hidden"), SHAPES)
def test_rms_norm_matches_reference(lead, hidden, dtype, style):
    x, w, dy = _inputs(lead, hidden, dtype, style)
    y = rms_norm(x, w, 1e-6, style)
    assert type(y.grad_fn).__name__ == "RMSNormFunctionBackward", "the Triton path did not run"
    expected = rms_norm_reference(x, w, 1e-6, style)
    assert y.dtype == expected.dtype and y.shape == expected.shape
    torch.testing.assert_close(y, expected, **TOL[dtype], msg=lambda m: f"{style} {dtype} forward: {m}")
    dx, dw = _grads(y, dy, x, w)
    dx_ref, dw_ref = _grads(expected, dy, x, w)
    torch.testing.assert_close(dx, dx_ref, **TOL[dtype], msg=lambda m: f"{style} {dtype} dx: {m}")
    rows = x.numel() // hidden  # dw sums over rows: rounding differences grow like sqrt(rows)
    tol = {k: v * rows**0.5 for k, v in TOL[dtype].items()}
    torch.testing.assert_close(dw, dw_ref, **tol, msg=lambda m: f"{style} {dtype} dw: {m}")


@pytest.mark.parametrize("style", ["llama", "gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("lead", "hidden"), SHAPES[:3])
def test_add_rms_norm_matches_reference(lead, hidden, dtype, style):
    x, w, dy = _inputs(lead, hidden, dtype, style)
    residual, _, dh = _inputs(lead, hidden, dtype, style, seed=1)
    h, y = add_rms_norm(residual, x, w, 1e-6, style)
    assert type(y.grad_fn).__name__ == "AddRMSNormFunctionBackward", "the Triton path did not run"
    h_ref, y_ref = add_rms_norm_reference(residual, x, w, 1e-6, style)
    torch.testing.assert_close(h, h_ref, **TOL[dtype])
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    got = torch.autograd.grad((h, y), (residual, x, w), (dh, dy))
    want = torch.autograd.grad((h_ref, y_ref), (residual, x, w), (dh, dy))
    for g, e, name in zip(got, want, ("dresidual", "dx", "dw"), strict=True):
        tol = {k: v * 4 for k, v in TOL[dtype].items()} if name == "dw" else TOL[dtype]
        torch.testing.assert_close(g, e, **tol, msg=lambda m, n=name: f"{style} {dtype} {n}: {m}")


def test_mixed_dtype_llama_style_promotes_like_transformers():
    """An fp32 weight on bf16 activations (norms upcast for k-bit training) gives an fp32 output, as HF does."""
    x = torch.randn(3, 40).to(torch.bfloat16)
    w = torch.randn(40)
    y = rms_norm(x, w, 1e-5)
    expected = rms_norm_reference(x, w, 1e-5)
    assert y.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(y, expected, **TOL[torch.bfloat16])  # the normalized row is rounded to bf16


def test_weight_gradient_skipped_when_frozen():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.ones(16)  # frozen, as in LoRA training
    y = rms_norm(x, w, 1e-6)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    (dx_ref,) = torch.autograd.grad(rms_norm_reference(x, w, 1e-6).sum(), (x,))
    torch.testing.assert_close(dx, dx_ref, atol=1e-5, rtol=1e-5)


def test_fused_module_shares_the_weight_and_falls_back_without_triton(monkeypatch):
    w = torch.nn.Parameter(torch.rand(24) + 0.5)
    norm = FusedRMSNorm(w, 1e-6)
    assert norm.weight is w and list(norm.state_dict()) == ["weight"]
    x = torch.randn(2, 3, 24)
    assert type(norm(x).grad_fn).__name__ == "RMSNormFunctionBackward"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU without the interpreter: the torch reference runs
    y = norm(x)
    assert "RMSNormFunction" not in type(y.grad_fn).__name__
    torch.testing.assert_close(y, rms_norm_reference(x, w, 1e-6), atol=0, rtol=0)


def test_without_grad_the_kernels_run_without_an_autograd_node_and_give_the_same_values():
    """A checkpointed layer's first forward runs without grad: the kernel is launched directly (no autograd node,
    less host time per call) and gives the values the autograd path gives."""
    x, w, _ = _inputs((4,), 33, torch.float32, "llama")
    residual = torch.randn_like(x)
    with torch.no_grad():
        y_direct = rms_norm(x, w, 1e-6)
        h_direct, y_added_direct = add_rms_norm(residual, x, w, 1e-6)
    assert y_direct.grad_fn is None and h_direct.grad_fn is None
    assert torch.equal(y_direct, rms_norm(x, w, 1e-6).detach())
    h, y_added = add_rms_norm(residual, x, w, 1e-6)
    assert torch.equal(h_direct, h.detach()) and torch.equal(y_added_direct, y_added.detach())

"""The AdamW kernel under Triton's CPU interpreter against its torch reference, with the kernel's float arguments
passed as fp32 scalars, as the compiled kernel receives them.

The interpreter hands float arguments to the kernel as Python floats, so arithmetic on them runs in double there;
compiled, they are fp32. A kernel that computed 1 - beta2 from its fp32 beta2 (1 - fl32(0.999) = 0.00099998713,
1.3e-5 below 0.001) put v 1.3e-5 off on an H200 while the plain interpreter showed nothing. The `compiled_scalars`
fixture makes the interpreted launch pass fp32 scalars, so such an error shows up here, without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")

from hone.kernels._runtime import launcher  # noqa: E402
from hone.kernels.adamw import adamw_step_, adamw_step_reference  # noqa: E402

HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
STEP = 3
BIAS = dict(bias1=1 - 0.9**STEP, bias2=1 - 0.999**STEP)
N = 5000  # three 2048-value programs, the last one partial


@pytest.fixture
def compiled_scalars(monkeypatch):
    """TRITON_INTERPRET=1, and float launch arguments converted to fp32 scalars (as Triton specializes them)."""
    implicit_cvt = interpreter._implicit_cvt

    def to_fp32(arg):
        if type(arg) is float:
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return implicit_cvt(arg)

    monkeypatch.setattr(interpreter, "_implicit_cvt", to_fp32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@triton.jit
def _one_minus_kernel(x, out_ptr):
    tl.store(out_ptr, 1.0 - x)


def test_interpreted_launch_passes_float_arguments_as_fp32(compiled_scalars):
    out = torch.zeros(1)
    launcher(_one_minus_kernel, out.device)[(1,)](0.999, out)
    assert out.item() == float(np.float32(1.0) - np.float32(0.999))  # 0.00099998713, not fl32(0.001)


def _state(seed: int, state_dtype: torch.dtype, zero_moments: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(N, generator=gen)
    g = torch.randn(N, generator=gen).to(torch.bfloat16)
    m = (0.1 * torch.randn(N, generator=gen)).to(state_dtype)
    v = (0.01 * torch.rand(N, generator=gen)).to(state_dtype)
    if zero_moments:
        m.zero_()
        v.zero_()
    return p, g, m, v


def _kernel_and_reference(seed: int, state_dtype: torch.dtype, zero_moments: bool):
    ours = _state(seed, state_dtype, zero_moments)
    theirs = [t.clone() for t in ours]
    coef = torch.tensor([0.5])
    adamw_step_(*ours, coef, **HYPER, step=STEP, seed=seed)
    assert ours[0].ne(theirs[0]).any(), "the kernel did not run"
    adamw_step_reference(*theirs, coef, **HYPER, **BIAS, seed=seed)
    return ours, theirs


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_first_step_moments_equal_the_reference_bit_for_bit(compiled_scalars, state_dtype, seed):
    """From zero moments m = (1 - beta1) g and v = (1 - beta2) g^2 are single products (no multiply-add to fuse),
    so any difference is in the coefficients: it must be none, in float32 and through bf16 stochastic rounding."""
    (p, _, m, v), (p_ref, _, m_ref, v_ref) = _kernel_and_reference(seed, state_dtype, zero_moments=True)
    assert torch.equal(m, m_ref), f"m: {(m.float() - m_ref.float()).abs().max():.3g} max apart"
    assert torch.equal(v, v_ref), f"v: {((v.float() - v_ref.float()).abs() / v_ref.float()).max():.3g} relative"
    torch.testing.assert_close(p, p_ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2, 123456789])
def test_moments_match_the_reference_to_multiply_add_rounding(compiled_scalars, state_dtype, seed):
    """The GPU test's data: beta * old + (1 - beta) * new, where the torch reference fuses a multiply-add that the
    interpreter (numpy) does not: an ulp apart at most (see tests/kernels/test_adamw_gpu.py for the bounds)."""
    (p, _, m, v), (p_ref, _, m_ref, v_ref) = _kernel_and_reference(seed, state_dtype, zero_moments=False)
    torch.testing.assert_close(p, p_ref, rtol=1e-6, atol=1e-7)
    if state_dtype == torch.float32:
        torch.testing.assert_close(m, m_ref, rtol=2.4e-7, atol=3e-8)
        torch.testing.assert_close(v, v_ref, rtol=2.4e-7, atol=0.0)
    else:
        # the same random bits: float32 values an ulp apart land on different bf16 neighbours about once in 2^16
        # (more often where m cancels to near zero: then 3e-8 apart, as in float32)
        for name, got, want in (("m", m, m_ref), ("v", v, v_ref)):
            assert got.ne(want).sum() <= 2, f"{name}: {int(got.ne(want).sum())} of {N} bf16 values differ"
            torch.testing.assert_close(got, want, rtol=2**-7, atol=3e-8)

"""SwiGLU / GeGLU, the gated MLP's `act(gate) * up`, forward and backward in Triton.

Naming chain: `_glu_forward_kernel` / `_glu_backward_kernel` (Triton) -> `glu_forward` / `glu_backward`
(launchers) -> `GLUFunction` (autograd) -> `glu` (entry, with the torch fallback).

The eager path keeps three (tokens x intermediate) tensors for backward: gate, act(gate) and up. This one keeps
gate and up and recomputes the activation in backward, which is cheaper than the memory traffic it saves. The
activation is rounded to the activation dtype before the product, as the eager `act_fn(gate) * up` does.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import cdiv, launcher, use_triton
from hone.kernels._triton import tl, triton
from hone.kernels.reference import GLU_ACTIVATIONS, glu_reference

# Elementwise and memory bound: 1024 elements per program over 4 warps is 8 per thread, one 16-byte vector of
# bf16 per load, which saturates HBM on Hopper without a tail of tiny programs.
_BLOCK = 1024
_NUM_WARPS = 4
_ACTIVATION_IDS = {name: i for i, name in enumerate(GLU_ACTIVATIONS)}  # silu 0, gelu_tanh 1, gelu 2
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _glu_forward_kernel(gate_ptr, up_ptr, out_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACTIVATION == 1:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # sqrt(2 / pi) * (g + 0.044715 g^3)
        a = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))  # 0.5 g (1 + tanh z), with 1 + tanh z = 2 sigmoid(2z)
    else:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    a = a.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_backward_kernel(
    dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr
):
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = offs < n
    dout = tl.load(dout_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        sig = 1.0 / (1.0 + tl.exp(-g))
        a = g * sig
        da = sig * (1.0 + g * (1.0 - sig))
    elif ACTIVATION == 1:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 / (1.0 + tl.exp(-2.0 * z)) - 1.0  # tanh z
        a = 0.5 * g * (1.0 + t)
        da = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)
    else:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
        da = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476)) + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    a = a.to(dup_ptr.dtype.element_ty).to(tl.float32)
    tl.store(dgate_ptr + offs, (dout * u * da).to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offs, (dout * a).to(dup_ptr.dtype.element_ty), mask=mask)


def glu_forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """`act(gate) * up` for contiguous same-shape gate and up (any shape); returns a new tensor like gate."""
    out = torch.empty_like(gate)
    n = gate.numel()
    launcher(_glu_forward_kernel, gate.device)[(cdiv(n, _BLOCK),)](
        gate, up, out, n, ACTIVATION=_ACTIVATION_IDS[activation], BLOCK=_BLOCK, num_warps=_NUM_WARPS
    )
    return out


def glu_backward(
    dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) from the output gradient, recomputing the activation from gate."""
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    launcher(_glu_backward_kernel, gate.device)[(cdiv(n, _BLOCK),)](
        dout, gate, up, dgate, dup, n, ACTIVATION=_ACTIVATION_IDS[activation], BLOCK=_BLOCK, num_warps=_NUM_WARPS
    )
    return dgate, dup


class GLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        ctx.activation = activation
        return glu_forward(gate, up, activation)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        gate, up = ctx.saved_tensors
        dgate, dup = glu_backward(dout.contiguous(), gate, up, ctx.activation)
        return dgate, dup, None


def glu(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """`act(gate) * up` (SwiGLU for "silu", GeGLU for "gelu_tanh" / "gelu"); shapes (..., I), same dtype."""
    if activation not in _ACTIVATION_IDS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {GLU_ACTIVATIONS}")
    if (
        use_triton(gate, up)
        and gate.shape == up.shape
        and gate.dtype == up.dtype
        and gate.dtype in _FLOAT_DTYPES
        and gate.numel() > 0
    ):
        if not torch.is_grad_enabled():  # no autograd node to record
            return glu_forward(gate.contiguous(), up.contiguous(), activation)
        return GLUFunction.apply(gate, up, activation)
    return glu_reference(gate, up, activation)

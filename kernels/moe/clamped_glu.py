"""gpt-oss's experts activation, fused for the MoE layer: on interleaved columns (gate at even, up at odd ones),
`(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)`.

Naming chain as in `hone.kernels.moe.glu`: `_clamped_glu_forward_kernel` / `_clamped_glu_backward_kernel` (Triton)
-> `clamped_glu_forward` / `clamped_glu_backward` (launchers) -> `clamped_glu` / `clamped_glu_grad` (entries, which
fall back to the torch forms `clamped_glu_reference` / `clamped_glu_grad_reference`). In eager torch the activation
is a dozen elementwise kernels with strided slices each way, and its autograd keeps their outputs; here one pass reads
gate_up, and the backward pass gives h, the gradient towards gate_up and the routing weights' row dots at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hone.kernels._runtime import launcher, sum_combine, use_triton
from hone.kernels._triton import tl, triton

# One program per row; gpt-oss's experts are 2,880 wide (5,760-wide gate_up rows): three 1024-column steps.
_BLOCK = 1024
_NUM_WARPS = 4


@dataclass(frozen=True)
class ClampedGlu:
    """The constants of gpt-oss's gate (`swiglu_alpha`, `swiglu_limit` in its config)."""

    alpha: float
    limit: float


@triton.jit
def _clamped_glu_forward_kernel(gu_ptr, h_ptr, n_cols, stride_gu, stride_h, alpha, limit, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(gu_ptr + row * stride_gu + 2 * cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + 2 * cols + 1, mask=mask, other=0.0).to(tl.float32)
        gate_in = gate <= limit
        up_in = (up >= -limit) & (up <= limit)
        g = tl.where(gate_in, gate, limit)
        sig = 1.0 / (1.0 + tl.exp(-alpha * g))
        u1 = tl.where(up_in, up, tl.where(up > 0, limit, -limit)) + 1.0
        tl.store(h_ptr + row * stride_h + cols, (u1 * g * sig).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _clamped_glu_backward_kernel(
    gu_ptr, g_ptr, w_ptr, h_ptr, dgu_ptr, dw_ptr, n_cols, stride_gu, stride_g, stride_h, stride_dgu, alpha, limit,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    weight = tl.load(w_ptr + row).to(tl.float32)
    dot = tl.full((BLOCK,), 0.0, tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(gu_ptr + row * stride_gu + 2 * cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + 2 * cols + 1, mask=mask, other=0.0).to(tl.float32)
        grad = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        gate_in = gate <= limit
        up_in = (up >= -limit) & (up <= limit)
        g = tl.where(gate_in, gate, limit)
        sig = 1.0 / (1.0 + tl.exp(-alpha * g))
        u1 = tl.where(up_in, up, tl.where(up > 0, limit, -limit)) + 1.0
        glu = g * sig
        h = (u1 * glu).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
        dot += grad * h.to(tl.float32)
        dh = grad * weight
        d_gate = tl.where(gate_in, dh * u1 * sig * (1.0 + alpha * g * (1.0 - sig)), 0.0)
        d_up = tl.where(up_in, dh * glu, 0.0)
        tl.store(dgu_ptr + row * stride_dgu + 2 * cols, d_gate.to(dgu_ptr.dtype.element_ty), mask=mask)
        tl.store(dgu_ptr + row * stride_dgu + 2 * cols + 1, d_up.to(dgu_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + row, tl.reduce(dot, 0, sum_combine))


def _rows_ok(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1


def clamped_glu_forward(gate_up: torch.Tensor, gate: ClampedGlu) -> torch.Tensor:
    """(S, 2I) interleaved -> (S, I) in gate_up's dtype (rows with unit column stride), computed in float32."""
    rows, width = gate_up.shape
    h = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        launcher(_clamped_glu_forward_kernel, gate_up.device)[(rows,)](
            gate_up, h, width // 2, gate_up.stride(0), h.stride(0), float(gate.alpha), float(gate.limit),
            BLOCK=_BLOCK, num_warps=_NUM_WARPS,
        )  # fmt: skip
    return h


def clamped_glu_backward(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, gate: ClampedGlu, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The activation's backward for the experts layer in one pass, as `glu.swiglu_halves_backward` is for Qwen's
    gate: h recomputed, the gradient of `row_weight * g . h` towards gate_up (zero where a clamp held the value), and
    the row dots `<g, h>` in float32. `overwrite` writes d gate_up over gate_up (each value is read first)."""
    rows, width = gate_up.shape
    h = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    d_gate_up = gate_up if overwrite else torch.empty_like(gate_up, memory_format=torch.contiguous_format)
    dots = torch.empty(rows, dtype=torch.float32, device=gate_up.device)
    if rows:
        launcher(_clamped_glu_backward_kernel, gate_up.device)[(rows,)](
            gate_up, g, row_weight, h, d_gate_up, dots, width // 2, gate_up.stride(0), g.stride(0), h.stride(0),
            d_gate_up.stride(0), float(gate.alpha), float(gate.limit), BLOCK=_BLOCK, num_warps=_NUM_WARPS,
        )  # fmt: skip
    return h, d_gate_up, dots


def clamped_glu_reference(gate_up: torch.Tensor, gate: ClampedGlu) -> torch.Tensor:
    """What gpt-oss's `_apply_gate` computes, in float32, rounded once to gate_up's dtype (the kernels' roundings)."""
    g = gate_up[..., ::2].float().clamp(max=gate.limit)
    up = gate_up[..., 1::2].float().clamp(-gate.limit, gate.limit)
    return ((up + 1.0) * g * torch.sigmoid(gate.alpha * g)).to(gate_up.dtype)


def clamped_glu_grad_reference(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, gate: ClampedGlu, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`clamped_glu_backward` in torch, with the kernel's roundings."""
    dtype = gate_up.dtype
    raw_gate, raw_up = gate_up[:, ::2].float(), gate_up[:, 1::2].float()
    gate_in = raw_gate <= gate.limit
    up_in = (raw_up >= -gate.limit) & (raw_up <= gate.limit)
    clamped = raw_gate.clamp(max=gate.limit)
    u1 = raw_up.clamp(-gate.limit, gate.limit) + 1.0
    sig = torch.sigmoid(gate.alpha * clamped)
    glu = clamped * sig
    h = (u1 * glu).to(dtype)
    gf = g.float()
    dots = (gf * h.float()).sum(-1)
    dh = gf * row_weight.float()[:, None]
    d_gate = torch.where(gate_in, dh * u1 * sig * (1.0 + gate.alpha * clamped * (1.0 - sig)), 0.0)
    d_up = torch.where(up_in, dh * glu, 0.0)
    d_gate_up = torch.stack([d_gate, d_up], dim=-1).reshape(gate_up.shape).to(dtype)
    if overwrite:
        d_gate_up = gate_up.copy_(d_gate_up)
    return h, d_gate_up, dots


def clamped_glu(gate_up: torch.Tensor, gate: ClampedGlu) -> torch.Tensor:
    """The activation on gate_up (S, 2I): the Triton kernel where it runs, else the reference."""
    if use_triton(gate_up) and _rows_ok(gate_up) and gate_up.shape[1] % 2 == 0:
        return clamped_glu_forward(gate_up, gate)
    return clamped_glu_reference(gate_up, gate)


def clamped_glu_grad(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, gate: ClampedGlu, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, d_gate_up, <g, h> per row): see `clamped_glu_backward`; the reference where the kernel cannot run."""
    if use_triton(gate_up, g, row_weight) and _rows_ok(gate_up) and _rows_ok(g) and gate_up.shape[1] % 2 == 0:
        return clamped_glu_backward(gate_up, g, row_weight.contiguous(), gate, overwrite)
    return clamped_glu_grad_reference(gate_up, g, row_weight, gate, overwrite)

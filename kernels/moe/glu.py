"""The experts' gated activation `silu(gate) * up` on concatenated halves, with its backward fused for the MoE layer.

Naming chain: `_swiglu_halves_forward_kernel` / `_swiglu_halves_backward_kernel` (Triton) ->
`swiglu_halves_forward` / `swiglu_halves_backward` (launchers) -> `swiglu_halves` / `swiglu_halves_grad` (entries,
which fall back to the torch references `swiglu_halves_reference` / `swiglu_halves_grad_reference`). There is no
autograd Function: the experts layer (`hone.kernels.moe.experts`) calls the backward itself, which gives h, the
gradient towards gate_up and the routing weights' gradient in one pass (`swiglu_halves_backward` says why).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hone.kernels._runtime import launcher, sum_combine, use_triton
from hone.kernels._triton import tl, triton

# One program per row; Qwen3-30B-A3B's experts are 768 wide (1,536-wide gate_up rows). A 1024-column block covers
# them in one step with 8 bf16 values (one 16-byte load) per thread of 4 warps; wider experts loop.
_BLOCK = 1024
_NUM_WARPS = 4


@triton.jit
def _swiglu_halves_forward_kernel(gu_ptr, h_ptr, n_cols, stride_gu, stride_h, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(h_ptr.dtype.element_ty).to(tl.float32)
        tl.store(h_ptr + row * stride_h + cols, (act * up).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_halves_backward_kernel(
    gu_ptr, g_ptr, w_ptr, h_ptr, dgu_ptr, dw_ptr, n_cols, stride_gu, stride_g, stride_h, stride_dgu, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    weight = tl.load(w_ptr + row).to(tl.float32)
    dot = tl.full((BLOCK,), 0.0, tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        gate = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gu_ptr + row * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-gate))
        act = (gate * sig).to(h_ptr.dtype.element_ty).to(tl.float32)
        h = (act * up).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * stride_h + cols, h, mask=mask)
        dot += g * h.to(tl.float32)
        dh = g * weight
        tl.store(
            dgu_ptr + row * stride_dgu + cols,
            (dh * up * sig * (1.0 + gate * (1.0 - sig))).to(dgu_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(dgu_ptr + row * stride_dgu + n_cols + cols, (dh * act).to(dgu_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + row, tl.reduce(dot, 0, sum_combine))


def _rows_ok(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1


def swiglu_halves_forward(gate_up: torch.Tensor) -> torch.Tensor:
    """(S, 2I) -> (S, I) `silu(gate_up[:, :I]) * gate_up[:, I:]` in gate_up's dtype (rows with unit column stride).

    The activation is rounded to gate_up's dtype before the product, as in `swiglu_halves_backward`.
    """
    rows, width = gate_up.shape
    h = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        launcher(_swiglu_halves_forward_kernel, gate_up.device)[(rows,)](
            gate_up, h, width // 2, gate_up.stride(0), h.stride(0), BLOCK=_BLOCK, num_warps=_NUM_WARPS
        )
    return h


def swiglu_halves_backward(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The activation's backward for the experts layer, in one pass.

    Qwen-style experts compute one (S, 2I) product `gate_up = x @ W_gate_up[e]` and apply `silu(gate_up[:, :I]) *
    gate_up[:, I:]`. In backward the experts layer needs three things from it at once: the activation h again (its
    LoRA and weight gradients read it), the gradient towards gate_up, and the routing weight's gradient `<g, h>` per
    row. The eager way builds an autograd graph for the activation, materializes float32 copies for the row dot
    products and makes a (S, 2I) concatenation; this kernel reads gate_up and g once and writes h, d gate_up and the
    row dots in one pass.

    Roundings: the activation is rounded to the activation dtype before the product and h is rounded before the row
    dot (what the GEMMs see); the gradients are computed in float32 from the 16-bit inputs and rounded once.

    Args:
        gate_up: (S, 2I) the saved up-projection output.
        g: (S, I) gradient reaching h per unit routing weight (d y / d h).
        row_weight: (S,) routing weight of each row.
        overwrite: write d gate_up over gate_up (each value is read before it is written), saving (S, 2I) of
            memory when the caller needs gate_up no more.

    Returns:
        h (S, I) recomputed, d_gate_up (S, 2I) = gradient of `row_weight * g . h` towards gate_up (both in
        gate_up's dtype), and the row dots `<g, h>` (S,) in float32.
    """
    rows, width = gate_up.shape
    h = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    d_gate_up = gate_up if overwrite else torch.empty_like(gate_up, memory_format=torch.contiguous_format)
    dots = torch.empty(rows, dtype=torch.float32, device=gate_up.device)
    if rows:
        launcher(_swiglu_halves_backward_kernel, gate_up.device)[(rows,)](
            gate_up,
            g,
            row_weight,
            h,
            d_gate_up,
            dots,
            width // 2,
            gate_up.stride(0),
            g.stride(0),
            h.stride(0),
            d_gate_up.stride(0),
            BLOCK=_BLOCK,
            num_warps=_NUM_WARPS,
        )
    return h, d_gate_up, dots


def swiglu_halves_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """What `_apply_gate` of transformers' gated experts computes with a silu `act_fn`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_halves_grad_reference(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`swiglu_halves_backward` in torch, with the kernel's roundings (float32 math on the 16-bit inputs)."""
    dtype = gate_up.dtype
    gate, up = gate_up.float().chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    act = (gate * sig).to(dtype).float()
    h = (act * up).to(dtype)
    gf = g.float()
    dots = (gf * h.float()).sum(-1)
    dh = gf * row_weight.float()[:, None]
    d_gate_up = torch.cat([dh * up * sig * (1.0 + gate * (1.0 - sig)), dh * act], dim=-1).to(dtype)
    if overwrite:
        d_gate_up = gate_up.copy_(d_gate_up)
    return h, d_gate_up, dots


def swiglu_halves(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` on the halves of gate_up (S, 2I): the Triton kernel where it runs, else the reference."""
    if use_triton(gate_up) and _rows_ok(gate_up) and gate_up.shape[1] % 2 == 0:
        return swiglu_halves_forward(gate_up)
    return swiglu_halves_reference(gate_up)


def swiglu_halves_grad(
    gate_up: torch.Tensor, g: torch.Tensor, row_weight: torch.Tensor, overwrite: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, d_gate_up, <g, h> per row): see `swiglu_halves_backward`; the reference where the kernel cannot run."""
    if use_triton(gate_up, g, row_weight) and _rows_ok(gate_up) and _rows_ok(g) and gate_up.shape[1] % 2 == 0:
        return swiglu_halves_backward(gate_up, g, row_weight.contiguous(), overwrite)
    return swiglu_halves_grad_reference(gate_up, g, row_weight, overwrite)

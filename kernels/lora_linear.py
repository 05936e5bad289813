"""LoRA linear: `base(x) + scaling * B(A(x))` with its own backward, for dense or nf4 (QLoRA) base weights.

Naming chain: `lora_linear_forward` / `lora_linear_backward` (launchers) -> `LoRALinearFunction` (autograd) ->
`lora_linear` (entry). The work is four GEMMs, which cuBLAS runs better than any Triton kernel we could
write, so there is no `@triton.jit` here; what this file changes is what is computed and kept (`LoRALinearFunction`
lists it). All GEMMs run in the activation dtype: the adapters are cast down, with the scaling folded into B's
cast (`b_scaled` = `scaling * B`), once per optimizer step inside `reuse_weight_casts()`.
"""

from __future__ import annotations

import torch

from hone.kernels.nf4 import NF4Weight
from hone.kernels.weight_casts import cast_weight

_FP32_OUT_MM = {"supported": None}  # whether torch.mm(..., out_dtype=torch.float32) runs on this CUDA build


def _mm_into(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`a @ b` returned in `dtype`. On CUDA, 16-bit operands with an fp32 result skip the rounding to 16 bits."""
    if dtype == torch.float32 and a.dtype != dtype and a.is_cuda and _FP32_OUT_MM["supported"] is not False:
        try:
            out = torch.mm(a, b, out_dtype=torch.float32)
            _FP32_OUT_MM["supported"] = True
            return out
        except (TypeError, RuntimeError, NotImplementedError):
            _FP32_OUT_MM["supported"] = False
    return _as(torch.mm(a, b), dtype)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t.to(dtype)` without the call when it would change nothing (these run hundreds of times per step)."""
    return t if t.dtype == dtype else t.to(dtype)


def _base_weight(weight: torch.Tensor | None, nf4: NF4Weight | None, dtype: torch.dtype) -> torch.Tensor:
    return nf4.dequantize(dtype) if nf4 is not None else weight


def lora_linear_forward(
    x: torch.Tensor,
    x_lora: torch.Tensor,
    weight: torch.Tensor | None,
    nf4: NF4Weight | None,
    bias: torch.Tensor | None,
    a: torch.Tensor,
    b_scaled: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) inputs -> ((M, N) output in x's dtype, (M, r) `A x_lora`); `x_lora` is x itself or its dropped-out
    copy; `a` (r, K) and `b_scaled` (N, r, the scaling applied) are in x's dtype."""
    base = _base_weight(weight, nf4, x.dtype).t()
    # mm / addmm directly: F.linear reaches the same GEMM through more dispatcher steps (host time per call)
    out = torch.mm(x, base) if bias is None else torch.addmm(bias, x, base)
    xa = _as(x_lora, x.dtype) @ a.t()
    return out.addmm_(xa, b_scaled.t()), xa


def lora_linear_backward(
    grad: torch.Tensor,
    x_lora: torch.Tensor,
    weight: torch.Tensor | None,
    nf4: NF4Weight | None,
    a: torch.Tensor,
    b_scaled: torch.Tensor,
    scaling: float,
    separate_lora_input: bool,
    needs: tuple[bool, ...],
    xa: torch.Tensor,
    grad_dtypes: tuple[torch.dtype, torch.dtype],
):
    """Gradients for (x, x_lora, bias, lora_a, lora_b), each None where not needed.

    Args:
        grad: (M, N) gradient of the output. x_lora: (M, K) the saved LoRA input.
        a, b_scaled: forward's casts of A and of `scaling * B`, in grad's dtype.
        xa: (M, r) `A x_lora` from forward, in grad's dtype.
        separate_lora_input: x_lora is a different tensor from x (dropout), so its gradient is returned on its
            own instead of being added into x's.
        needs: `ctx.needs_input_grad` for (x, x_lora, bias, lora_a, lora_b).
        grad_dtypes: the dtypes of A's and B's gradients (the adapters' own).
    """
    need_x, need_x_lora, need_bias, need_a, need_b = needs
    dtype = grad.dtype
    xl = _as(x_lora, dtype)
    grad_xa = grad @ b_scaled  # (M, r): gradient reaching A x, scaling included
    dx = dx_lora = None
    if need_x:
        dx = grad @ _base_weight(weight, nf4, dtype)
        if not separate_lora_input:
            dx.addmm_(grad_xa, a)
    if separate_lora_input and need_x_lora:
        dx_lora = _as(grad_xa @ a, x_lora.dtype)
    dbias = grad.sum(0) if need_bias else None
    da = _mm_into(grad_xa.t(), xl, grad_dtypes[0]) if need_a else None
    db = _mm_into(grad.t(), _as(xa, dtype), grad_dtypes[1]).mul_(scaling) if need_b else None
    return dx, dx_lora, dbias, da, db


class LoRALinearFunction(torch.autograd.Function):
    """Autograd for `lora_linear` on 2-D inputs; what it computes and keeps differs from peft's eager path.

    forward(x (M, K), x_lora (M, K) or None, weight (N, K) or None, nf4, bias (N,) or None, lora_a (r, K),
    lora_b (N, r), scaling) -> (M, N) in x's dtype.

    - The LoRA update is added into the base output by the GEMM itself (`addmm_`, beta=1), with no (M, N)
      temporaries for `B(A x)`, its scaled copy, or the sum.
    - Backward keeps the LoRA input (the layer input, or its dropped-out copy), `A x` ((M, r): r/K of the input's
      size, and keeping it saves backward a full read of the input) and references to the weights. The base output
      is never kept, and an nf4 base weight is dequantized again instead of keeping a 16-bit copy between forward
      and backward.
    - All GEMMs run in the activation dtype: fp32 adapter weights (peft's default next to a bf16 base) are cast
      down, 2 x r x (K + N) elements, instead of casting the (M, K) activations up and keeping that fp32 copy for
      backward as the eager path does. Adapter gradients come back in the adapters' dtype.
    - The scaling rides on the cast of B (`s B`), so neither forward nor the input gradients spend a kernel on it;
      backward reuses forward's casts instead of casting again. Inside `reuse_weight_casts()` (the trainer opens it
      around one optimizer step's forward and backward passes, when the adapters cannot change) each weight is cast
      once per step and shared by every call: forward, a checkpointed layer's recompute and backward. A step is
      bound by the host launching kernels on small models, and these casts were a large share of each LoRA
      linear's launches (docs/performance/host-time.md).
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        x_lora: torch.Tensor | None,
        weight: torch.Tensor | None,
        nf4: NF4Weight | None,
        bias: torch.Tensor | None,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        separate = x_lora is not None
        x_lora = x_lora if separate else x
        a, b_scaled = cast_weight(lora_a, x.dtype), cast_weight(lora_b, x.dtype, scaling)
        out, xa = lora_linear_forward(x, x_lora, weight, nf4, bias, a, b_scaled)
        ctx.save_for_backward(x_lora, weight, a, b_scaled, xa)
        ctx.nf4, ctx.scaling, ctx.separate = nf4, scaling, separate
        ctx.grad_dtypes = (lora_a.dtype, lora_b.dtype)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x_lora, weight, a, b_scaled, xa = ctx.saved_tensors
        n = ctx.needs_input_grad
        dx, dx_lora, dbias, da, db = lora_linear_backward(
            grad,
            x_lora,
            weight,
            ctx.nf4,
            _as(a, grad.dtype),
            _as(b_scaled, grad.dtype),
            ctx.scaling,
            ctx.separate,
            (n[0], n[1], n[4], n[5], n[6]),
            xa,
            ctx.grad_dtypes,
        )
        return dx, dx_lora, None, None, dbias, da, db, None


def lora_linear(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    *,
    weight: torch.Tensor | None = None,
    nf4: NF4Weight | None = None,
    bias: torch.Tensor | None = None,
    x_lora: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, W, bias) + scaling * (x_lora @ A^T) @ B^T`, W dense or nf4, through `LoRALinearFunction`.

    Args:
        x: (..., K) input in the compute dtype (the dense weight's dtype, or the nf4 weight's compute dtype).
        lora_a: (r, K); lora_b: (N, r), any float dtype (cast to x's dtype for the GEMMs).
        scaling: the adapter's scale (alpha / r, or alpha / sqrt(r)).
        weight: (N, K) frozen dense weight, or None with `nf4`.
        nf4: the frozen 4-bit weight, dequantized to x's dtype in forward and again in backward.
        bias: (N,) or None.
        x_lora: (..., K) the LoRA branch's input when it differs from x (peft's dropout), else None.

    Returns:
        (..., N) in x's dtype.
    """
    if (weight is None) == (nf4 is None):
        raise ValueError("lora_linear needs exactly one of weight= and nf4=")
    if weight is not None and weight.requires_grad:
        raise ValueError("lora_linear keeps the base weight frozen; its gradient is not computed")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xl2 = x_lora.reshape(-1, x_lora.shape[-1]) if x_lora is not None else None
    if torch.is_grad_enabled():
        out = LoRALinearFunction.apply(x2, xl2, weight, nf4, bias, lora_a, lora_b, float(scaling))
    else:  # (a checkpointed forward, evaluation) no autograd node: less host time per call
        a, b_scaled = cast_weight(lora_a, x2.dtype), cast_weight(lora_b, x2.dtype, float(scaling))
        out = lora_linear_forward(x2, x2 if xl2 is None else xl2, weight, nf4, bias, a, b_scaled)[0]
    return out.view(*lead, out.shape[-1])

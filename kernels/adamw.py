"""AdamW over one flat buffer of parameters, with 16-bit moments stored by stochastic rounding; and the squared norm
of a flat gradient buffer. Used by `hone.core.train.optim.FlatAdamW`.

Naming chain: `_adamw_kernel` / `_sum_squares_kernel` (Triton) -> `adamw_step_` / `sum_squares` (entries, each with
a torch fallback that computes the same values: `adamw_step_reference`, `sum_squares_reference`).
The kernel takes its float arguments as fp32 scalars, so every coefficient derived from the hyperparameters is
computed on the host in double and passed in; `adamw_step_` says why, and why bf16 moments round stochastically.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import cdiv, launcher, sum_combine, use_triton
from hone.kernels._triton import tl, triton

# Streaming kernels: 2048 elements per program over 4 warps (16 per thread) keep HBM busy on Hopper without a long
# tail; the optimizer buffers hold 1e7-1e9 values.
_BLOCK = 2048
_NUM_WARPS = 4
# Fallback path: rows of this many values per torch op bound its float32 temporaries to 64 MiB.
_TORCH_CHUNK = 1 << 24
# Hash constants (a 32-bit integer mixer with good avalanche, "lowbias32"); any well-mixing hash does here.
_MIX1, _MIX2, _GOLDEN = 0x7FEB352D, 0x846CA68B, 0x9E3779B1


# seed varies per step: unspecialized, or Triton would turn a seed of 1 into a compile-time constant (no .to)
@triton.jit(do_not_specialize=["seed"])
def _adamw_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    coef_ptr,
    n,
    beta1,
    one_minus_beta1,
    beta2,
    one_minus_beta2,
    decay,
    lr,
    bias1,
    bias2,
    eps,
    seed,
    STOCHASTIC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    coef = tl.load(coef_ptr).to(tl.float32)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) * coef
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # no arithmetic on the scalar arguments here: they are fp32 (see `adamw_step_`); g * g first, as the
    # reference squares the gradient before scaling it
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * (g * g)
    p = p * decay - lr * (m / bias1) / (tl.sqrt(v / bias2) + eps)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    if STOCHASTIC:
        # 32-bit hash of (seed, index); its low 16 bits are added below the bf16 cut, then the cut truncates
        h = (offs.to(tl.uint32) * 0x9E3779B1) ^ seed.to(tl.uint32)  # the constants of `_hash_bits`
        h = h ^ (h >> 16)
        h = h * 0x7FEB352D
        h = h ^ (h >> 15)
        h = h * 0x846CA68B
        h = h ^ (h >> 16)
        m_bits = (m.to(tl.uint32, bitcast=True) + (h & 0xFFFF)) & 0xFFFF0000
        h = h * 0x9E3779B1
        h = h ^ (h >> 15)
        v_bits = (v.to(tl.uint32, bitcast=True) + (h & 0xFFFF)) & 0xFFFF0000
        m = m_bits.to(tl.float32, bitcast=True)
        v = v_bits.to(tl.float32, bitcast=True)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_squares_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tl.program_id(0), tl.reduce(x * x, 0, sum_combine))


def _hash_bits(index: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's two 16-bit random fields per element, in int64 torch arithmetic (masked to 32 bits)."""
    mask = 0xFFFFFFFF
    h = ((index * _GOLDEN) & mask) ^ (seed & mask)
    h ^= h >> 16
    h = (h * _MIX1) & mask
    h ^= h >> 15
    h = (h * _MIX2) & mask
    h ^= h >> 16
    first = h & 0xFFFF
    h = (h * _GOLDEN) & mask
    h ^= h >> 15
    return first, h & 0xFFFF


def _stochastic_bf16(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """x (float32) rounded to bf16 stochastically: add 16 random low bits, cut them (exactly representable)."""
    raw = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    cut = ((raw + bits) & 0xFFFF0000).to(torch.int64)
    cut = torch.where(cut >= 2**31, cut - 2**32, cut).to(torch.int32)
    return cut.view(torch.float32).to(torch.bfloat16)


def adamw_step_reference(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    coef: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias1: float,
    bias2: float,
    seed: int,
) -> None:
    """`adamw_step_` in torch ops, chunk by chunk (the same values as the kernel, stochastic rounding included)."""
    stochastic = m.dtype == torch.bfloat16
    scale = coef.float()
    for start in range(0, p.numel(), _TORCH_CHUNK):
        sl = slice(start, start + _TORCH_CHUNK)
        gf = g[sl].float() * scale
        mf = m[sl].float().mul_(beta1).add_(gf, alpha=1.0 - beta1)
        vf = v[sl].float().mul_(beta2).add_(gf * gf, alpha=1.0 - beta2)
        pf = p[sl].float()
        pf = pf * (1.0 - lr * weight_decay) - lr * (mf / bias1) / ((vf / bias2).sqrt() + eps)
        p[sl] = pf.to(p.dtype)
        if stochastic:
            index = torch.arange(start, start + mf.numel(), device=p.device, dtype=torch.int64)
            m_bits, v_bits = _hash_bits(index, seed)
            m[sl] = _stochastic_bf16(mf, m_bits)
            v[sl] = _stochastic_bf16(vf, v_bits)
        else:
            m[sl] = mf.to(m.dtype)
            v[sl] = vf.to(v.dtype)


def adamw_step_(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    coef: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    seed: int,
) -> None:
    """One AdamW step over flat buffers, in place.

    One kernel updates every trainable value: it reads the parameter (fp32), its gradient (any float dtype, scaled by
    the clipping coefficient read from the device, so clipping needs no host sync) and both moments, and writes the
    parameter and the moments back. Moments kept in bf16 lose the small per-step changes of an exponential average
    when rounded to nearest (v changes by 0.1% a step, under half a bf16 unit); rounding stochastically keeps them
    unbiased. The random bits come from a hash of (seed, element index), so a step is reproducible from its seed.

    The kernel receives its float arguments as fp32 scalars, so every coefficient derived from the hyperparameters
    (1 - beta1, 1 - beta2, 1 - lr * weight_decay, the bias corrections) is computed here in double and passed in,
    as the torch reference computes it. Computed in the kernel from fp32 betas it would be off: fl32(0.999) is
    0.99900001287, and 1 - fl32(0.999) = 0.00099998713 is 1.3e-5 smaller than 0.001, which biases every v update by
    that much. What remains between kernel and reference is fused multiply-add rounding, an ulp or two.

    Args:
        p: (n,) parameters (float32). g: (n,) gradients (any float dtype).
        m, v: (n,) first and second moments, float32 or bf16 (bf16: stochastic rounding).
        coef: (1,) float32 on the device: the gradient's clipping factor (1 when not clipped).
        lr, beta1, beta2, eps, weight_decay: AdamW's hyperparameters (decoupled weight decay).
        step: the 1-based step number (bias correction). seed: the stochastic rounding's seed for this step.
    """
    lr, beta1, beta2, eps, weight_decay = float(lr), float(beta1), float(beta2), float(eps), float(weight_decay)
    args = dict(
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        bias1=1.0 - beta1**step,
        bias2=1.0 - beta2**step,
    )
    stochastic = m.dtype == torch.bfloat16
    if use_triton(p, g, m, v, coef) and m.dtype == v.dtype:
        n = p.numel()
        # the coefficients in double here, rounded once to fp32 at the launch (see the docstring)
        launcher(_adamw_kernel, p.device)[(cdiv(n, _BLOCK),)](
            p,
            g,
            m,
            v,
            coef,
            n,
            beta1,
            1.0 - beta1,
            beta2,
            1.0 - beta2,
            1.0 - lr * weight_decay,
            lr,
            args["bias1"],
            args["bias2"],
            eps,
            seed & 0x7FFFFFFF,
            STOCHASTIC=stochastic,
            BLOCK=_BLOCK,
            num_warps=_NUM_WARPS,
        )
        return
    adamw_step_reference(p, g, m, v, coef, **args, seed=seed & 0x7FFFFFFF)


def sum_squares_reference(x: torch.Tensor) -> torch.Tensor:
    """Sum of squares of x in float32, chunk by chunk (bounded temporaries)."""
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    for start in range(0, x.numel(), _TORCH_CHUNK):
        chunk = x[start : start + _TORCH_CHUNK].float()
        total += torch.dot(chunk, chunk)
    return total


def sum_squares(x: torch.Tensor) -> torch.Tensor:
    """Sum of squares of a flat tensor, accumulated in float32 on the device (no host sync). Returns a 0-d tensor."""
    if use_triton(x) and x.dim() == 1 and x.numel():
        n = x.numel()
        partial = torch.empty(cdiv(n, _BLOCK), dtype=torch.float32, device=x.device)
        launcher(_sum_squares_kernel, x.device)[(partial.numel(),)](x, partial, n, BLOCK=_BLOCK, num_warps=_NUM_WARPS)
        return partial.sum()
    return sum_squares_reference(x)

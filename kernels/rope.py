"""Rotary position embedding applied in place to q and k, forward and backward in Triton.

Naming chain: `_rope_kernel` (Triton) -> `rope_rotate` (launcher) -> `RotaryFunction`
(autograd) -> `apply_rotary` (entry, with the torch fallback; call-compatible with transformers'
`apply_rotary_pos_emb`).
Positions come in through cos/sin, which the model gathers per token from `position_ids`, so packed rows (positions
restarting at 0 inside a row) and any RoPE scaling the model computes need nothing special here.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import cdiv, launcher, next_power_of_2, use_triton
from hone.kernels._triton import tl, triton
from hone.kernels.reference import rope_reference

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PAIRS_PER_PROGRAM = 2048


@triton.jit
def _rope_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    n_tokens,
    seq_len,
    n_heads,
    half,
    stride_xb,
    stride_xs,
    stride_xh,
    stride_ob,
    stride_os,
    stride_oh,
    stride_cb,
    stride_cs,
    BACKWARD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = token < n_tokens
    b = (token // seq_len).to(tl.int64)
    s = (token % seq_len).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < half
    cs_mask = t_mask[:, None] & d_mask[None, :]
    cs = (b * stride_cb + s * stride_cs)[:, None] + d[None, :]
    cos1 = tl.load(cos_ptr + cs, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    cos2 = tl.load(cos_ptr + cs + half, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    sin1 = tl.load(sin_ptr + cs, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    sin2 = tl.load(sin_ptr + cs + half, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    if BACKWARD:
        # The transposed rotation: each pair (i, i + half) is rotated by [[c1, -s1], [s2, c2]]; its transpose is
        # the same formula with (s1, s2) replaced by (-s2, -s1).
        sin1, sin2 = -sin2, -sin1
    h = tl.arange(0, BLOCK_H).to(tl.int64)
    mask = t_mask[:, None, None] & (h < n_heads)[None, :, None] & d_mask[None, None, :]
    x_in = x_ptr + (b * stride_xb + s * stride_xs)[:, None, None] + (h * stride_xh)[None, :, None] + d[None, None, :]
    x_out = out_ptr + (b * stride_ob + s * stride_os)[:, None, None] + (h * stride_oh)[None, :, None] + d[None, None, :]
    x1 = tl.load(x_in, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_in + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_out, (x1 * cos1 - x2 * sin1).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(x_out + half, (x2 * cos2 + x1 * sin2).to(out_ptr.dtype.element_ty), mask=mask)


def _bsh(t: torch.Tensor, unsqueeze_dim: int) -> tuple[int, int, int]:
    """(batch, seq, heads) sizes or strides of a (B, H, S, D) tensor (or (B, S, H, D) when unsqueeze_dim == 2)."""
    sizes, strides = t.shape, t.stride()
    if unsqueeze_dim == 1:
        return (sizes[0], sizes[2], sizes[1]), (strides[0], strides[2], strides[1])
    return (sizes[0], sizes[1], sizes[2]), (strides[0], strides[1], strides[2])


def rope_rotate(
    x: torch.Tensor,
    out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    backward: bool = False,
) -> None:
    """Launch the kernel: `out` = the rotation of `x` (its transpose when `backward`); out may be x itself.

    One program rotates every head of a few tokens (so q and k take one launch each), reading each cos/sin row once.

    Args:
        x, out: (B, H, S, D) (or (B, S, H, D) with `unsqueeze_dim=2`), unit stride over D.
        cos, sin: (B or 1, S, D), unit stride over D.
    """
    (batch, seq_len, n_heads), x_strides = _bsh(x, unsqueeze_dim)
    _, out_strides = _bsh(out, unsqueeze_dim)
    half = x.shape[-1] // 2
    cos_b_stride = 0 if cos.shape[0] == 1 else cos.stride(0)  # one set of rows broadcast over the batch
    block_h, block_d = next_power_of_2(n_heads), next_power_of_2(half)
    # Each program rotates ~2K pairs (4K values): 16 per thread over 4 warps. That is one token of 32 query heads
    # of 128, or four tokens of 8 key heads; small heads batch more tokens per program.
    block_t = max(1, _PAIRS_PER_PROGRAM // (block_h * block_d))
    n_tokens = batch * seq_len
    launcher(_rope_kernel, x.device)[(cdiv(n_tokens, block_t),)](
        x,
        out,
        cos,
        sin,
        n_tokens,
        seq_len,
        n_heads,
        half,
        *x_strides,
        *out_strides,
        cos_b_stride,
        cos.stride(1),
        BACKWARD=backward,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=4,
    )


class RotaryFunction(torch.autograd.Function):
    """Rotates one tensor (q or k) in place. autograd lets a Function that writes into a view return only that
    one tensor, so q and k take one call each.

    The forward rotates in place (no new activations); backward applies the transposed rotation to the gradient and
    saves nothing but references to cos and sin.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
        rope_rotate(x, x, cos, sin, unsqueeze_dim)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        return x

    @staticmethod
    def backward(ctx, dx: torch.Tensor):
        cos, sin = ctx.saved_tensors
        dx_in = torch.empty_like(dx)
        rope_rotate(dx, dx_in, cos, sin, ctx.unsqueeze_dim, backward=True)
        return dx_in, None, None, None


def _supported(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> bool:
    if unsqueeze_dim not in (1, 2) or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    seq_dim = 2 if unsqueeze_dim == 1 else 1
    head_dim = q.shape[-1]
    return (
        q.dtype == k.dtype
        and q.dtype in _FLOAT_DTYPES
        and cos.dtype in _FLOAT_DTYPES
        and head_dim % 2 == 0
        and k.shape[-1] == head_dim
        and cos.shape[-1] == head_dim
        and k.shape[0] == q.shape[0]
        and k.shape[seq_dim] == q.shape[seq_dim] == cos.shape[1]
        and cos.shape[0] in (1, q.shape[0])
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and cos.stride(-1) == 1
        and sin.stride() == cos.stride()
        and q.numel() > 0
        and k.numel() > 0
    )


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k; in place by the Triton kernel where it runs, else the torch reference.

    Args:
        q: (B, Hq, S, D); k: (B, Hk, S, D) (or (B, S, H, D) for both with `unsqueeze_dim=2`). Must not be leaf
            tensors that require grad (they are written in place).
        cos, sin: (B or 1, S, D) rows at each token's position.

    Returns:
        The rotated (q, k): the same tensors on the Triton path, new ones on the reference path.
    """
    if use_triton(q, k, cos, sin) and _supported(q, k, cos, sin, unsqueeze_dim):
        if not torch.is_grad_enabled():  # no autograd nodes to record: rotate in place directly
            rope_rotate(q, q, cos, sin, unsqueeze_dim)
            rope_rotate(k, k, cos, sin, unsqueeze_dim)
            return q, k
        return RotaryFunction.apply(q, cos, sin, unsqueeze_dim), RotaryFunction.apply(k, cos, sin, unsqueeze_dim)
    return rope_reference(q, k, cos, sin, unsqueeze_dim)

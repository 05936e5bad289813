"""Cross-entropy over a chunk of logits, its gradient written over the logits in place: two passes over memory.

Naming chain: `_cross_entropy_kernel` (Triton) -> `cross_entropy_forward_backward` (launcher) ->
`cross_entropy_grad_` (entry, with the torch fallback `cross_entropy_grad_reference`). There is no autograd
Function: the chunked loss (`hone.core.train.loss`) asks for each chunk's loss and gradient at once.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import launcher, sum_combine, use_triton
from hone.kernels._triton import tl, triton

try:  # the combine function tl.max reduces with (a plain function the interpreter can call, as sum_combine)
    from triton.language.standard import _elementwise_max as max_combine
except ImportError:  # pragma: no cover - Triton versions that renamed it: the torch path runs instead
    max_combine = None

# 4096 logits per step: 8 KiB of bf16 per program iteration over 8 warps (16 values, two 16-byte loads per
# thread) keeps HBM busy; a 151,936-wide vocabulary row takes 38 steps per pass.
_BLOCK = 4096
_NUM_WARPS = 8
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Lanes start here instead of -inf, so exp(running max - new max) never meets inf - inf.
_NEG_START = -1.0e30


@triton.jit
def _cross_entropy_kernel(
    logits_ptr,
    targets_ptr,
    loss_ptr,
    n_cols,
    stride_row,
    scale,
    softcap,
    ignore_index,
    HAS_SOFTCAP: tl.constexpr,
    BLOCK: tl.constexpr,
    NEG_START: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride_row
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index

    # pass 1: per-lane running max and sum of exponents, combined across lanes at the end
    lane_max = tl.full((BLOCK,), NEG_START, tl.float32)
    lane_sum = tl.full((BLOCK,), 0.0, tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32) * scale
        if HAS_SOFTCAP:
            z = softcap * (2.0 / (1.0 + tl.exp(-2.0 * (z / softcap))) - 1.0)  # softcap * tanh(z / softcap)
        z = tl.where(mask, z, NEG_START)
        new_max = tl.maximum(lane_max, z)
        lane_sum = lane_sum * tl.exp(lane_max - new_max) + tl.where(mask, tl.exp(z - new_max), 0.0)
        lane_max = new_max
    row_max = tl.reduce(lane_max, 0, max_combine)
    lse = row_max + tl.log(tl.reduce(lane_sum * tl.exp(lane_max - row_max), 0, sum_combine))

    safe_target = tl.where(valid, target, 0).to(tl.int64)
    z_t = tl.load(base + safe_target).to(tl.float32) * scale
    if HAS_SOFTCAP:
        z_t = softcap * (2.0 / (1.0 + tl.exp(-2.0 * (z_t / softcap))) - 1.0)
    keep = valid.to(tl.float32)
    tl.store(loss_ptr + row, (lse - z_t) * keep)

    # pass 2: d loss / d raw logits = (softmax - onehot) * d z / d raw, written over the logits
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32) * scale
        t = z
        if HAS_SOFTCAP:
            t = 2.0 / (1.0 + tl.exp(-2.0 * (z / softcap))) - 1.0
            z = softcap * t
        grad = tl.exp(z - lse) - (cols == safe_target).to(tl.float32)
        grad = grad * (keep * scale)
        if HAS_SOFTCAP:
            grad = grad * (1.0 - t * t)
        tl.store(base + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


def cross_entropy_forward_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    scale: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Launch the kernel: per-row losses, and the logits overwritten by their gradient (see `cross_entropy_grad_`)."""
    rows, n_cols = logits.shape
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        launcher(_cross_entropy_kernel, logits.device)[(rows,)](
            logits,
            targets,
            losses,
            n_cols,
            logits.stride(0),
            float(scale),
            float(softcap or 1.0),
            int(ignore_index),
            HAS_SOFTCAP=softcap is not None,
            BLOCK=_BLOCK,
            NEG_START=_NEG_START,
            num_warps=_NUM_WARPS,
        )
    return losses


def cross_entropy_grad_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    scale: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """`cross_entropy_grad_` in torch ops (float32 math on a copy, the result cast back into `logits`)."""
    z = logits.float() * scale
    t = None
    if softcap is not None:
        t = torch.tanh(z / softcap)
        z = softcap * t
    valid = targets != ignore_index
    safe = targets.clamp(min=0).unsqueeze(1)
    lse = torch.logsumexp(z, dim=1)
    losses = (lse - z.gather(1, safe).squeeze(1)) * valid
    grad = (z - lse.unsqueeze(1)).exp_()
    grad.scatter_add_(1, safe, -torch.ones_like(safe, dtype=grad.dtype))
    grad.mul_(valid.unsqueeze(1) * scale)
    if t is not None:
        grad.mul_(1.0 - t * t)
    logits.copy_(grad)
    return losses


def cross_entropy_grad_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    scale: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Cross-entropy of each row of `logits` (after `z = scale * logits`, then `softcap * tanh(z / softcap)`), and
    the gradient of the summed loss towards the raw logits, written over `logits`.

    The chunked loss computes each chunk's logits with one matmul and needs, per row, the loss
    `logsumexp(z) - z[target]` and the gradient `softmax(z) - onehot(target)` towards the logits. In torch that takes
    a float32 copy of the chunk, a float32 temporary inside `logsumexp`, an exponent pass, a mask pass and a cast
    back: about 30 bytes of traffic per logit and three times the chunk in memory. The kernel runs one program per
    row, which reads its logits twice (an online max / sum, then the gradient) and overwrites them with the gradient
    in their own dtype: 6 bytes per bf16 logit and no extra memory.

    Args:
        logits: (rows, V) raw logits, any float dtype, unit column stride; overwritten.
        targets: (rows,) int64 class ids; `ignore_index` rows get loss 0 and gradient 0.

    Returns:
        (rows,) float32 losses.
    """
    if (
        fused_cross_entropy_runs(logits, targets)
        and logits.dim() == 2
        and logits.stride(1) == 1
        and logits.dtype in _FLOAT_DTYPES
        and targets.dtype == torch.int64
        and targets.is_contiguous()
    ):
        return cross_entropy_forward_backward(logits, targets, scale, softcap, ignore_index)
    return cross_entropy_grad_reference(logits, targets, scale, softcap, ignore_index)


def fused_cross_entropy_runs(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernel runs on these tensors' device (a CUDA GPU, the CPU interpreter, meta plans)."""
    return use_triton(*tensors) and max_combine is not None

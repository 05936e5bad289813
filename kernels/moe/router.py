"""A MoE router's top-k choice in one kernel each way: softmax over the experts, the k largest, renormalized or not.

What Qwen-style routers compute after their linear layer (`router_top_k_reference`), in one launch per direction
instead of five eager kernels forward and more backward (`RouterTopKFunction` says what each kernel does).

Naming chain: `_router_top_k_forward_kernel` / `_router_top_k_backward_kernel` (Triton) -> `router_top_k_forward` /
`router_top_k_backward` (launchers) -> `RouterTopKFunction` (autograd) -> `router_top_k` (entry, which falls back
to the torch reference `router_top_k_reference`).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from hone.kernels._runtime import cdiv, launcher, next_power_of_2, sum_combine, use_triton
from hone.kernels._triton import tl, triton

try:  # the combine functions tl.max / tl.min reduce with (plain functions the interpreter can call)
    from triton.language.standard import _elementwise_max as max_combine
    from triton.language.standard import _elementwise_min as min_combine
except ImportError:  # pragma: no cover - Triton versions that renamed them: the torch path runs instead
    max_combine = min_combine = None

# A block holds ~4K logits (32 rows of a 128-expert router): one 16-byte load per thread of 4 warps per 8 rows,
# and few enough values per thread that the k selection passes stay in registers.
_BLOCK_VALUES = 4096
_NUM_WARPS = 4
_MAX_EXPERTS = 1024  # one block row holds every expert of a row; wider routers take the torch path
_NEG = -1.0e30  # masked logits (softmax weight exactly 0, and no inf - inf)


@triton.jit
def _router_top_k_forward_kernel(
    logits_ptr,
    weights_ptr,
    index_ptr,
    n_rows,
    n_experts,
    stride_row,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    NEG: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    mask = (rows < n_rows)[:, None] & (cols < n_experts)[None, :]
    z = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_row + cols[None, :], mask=mask, other=0.0)
    z = tl.where(mask, z.to(tl.float32), NEG)
    e = tl.where(mask, tl.exp(z - tl.reduce(z, 1, max_combine)[:, None]), 0.0)
    total_e = tl.reduce(e, 1, sum_combine)
    # rows past the end are all 0; (a helper @triton.jit function for these lines would not run interpreted)
    p = e / tl.where(total_e > 0, total_e, 1.0)[:, None]
    row_ok = rows < n_rows
    out = rows.to(tl.int64) * TOP_K

    scale = tl.full((BLOCK_T,), 1.0, tl.float32)
    if NORMALIZE:  # the sum of the k largest, from a first selection pass
        remaining = tl.where(mask, p, -1.0)
        total = tl.full((BLOCK_T,), 0.0, tl.float32)
        for _ in range(TOP_K):
            top = tl.reduce(remaining, 1, max_combine)
            pick = tl.reduce(tl.where(remaining == top[:, None], cols[None, :], BLOCK_E), 1, min_combine)
            remaining = tl.where(cols[None, :] == pick[:, None], -1.0, remaining)
            total += top
        scale = 1.0 / total
    remaining = tl.where(mask, p, -1.0)
    for k in range(TOP_K):
        top = tl.reduce(remaining, 1, max_combine)
        pick = tl.reduce(tl.where(remaining == top[:, None], cols[None, :], BLOCK_E), 1, min_combine)
        remaining = tl.where(cols[None, :] == pick[:, None], -1.0, remaining)
        tl.store(weights_ptr + out + k, (top * scale).to(weights_ptr.dtype.element_ty), mask=row_ok)
        tl.store(index_ptr + out + k, pick.to(tl.int64), mask=row_ok)


@triton.jit
def _router_top_k_backward_kernel(
    logits_ptr,
    index_ptr,
    grad_ptr,
    d_logits_ptr,
    n_rows,
    n_experts,
    stride_row,
    stride_grad_row,
    stride_grad_col,
    stride_d_row,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    NEG: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    mask = (rows < n_rows)[:, None] & (cols < n_experts)[None, :]
    z = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_row + cols[None, :], mask=mask, other=0.0)
    z = tl.where(mask, z.to(tl.float32), NEG)
    e = tl.where(mask, tl.exp(z - tl.reduce(z, 1, max_combine)[:, None]), 0.0)
    total_e = tl.reduce(e, 1, sum_combine)
    p = e / tl.where(total_e > 0, total_e, 1.0)[:, None]
    row_ok = rows < n_rows
    picks = rows.to(tl.int64) * TOP_K
    grads = rows.to(tl.int64) * stride_grad_row

    # w_k = p_k / total: d p_k = (g_k - sum_j g_j w_j) / total (without normalizing: d p_k = g_k)
    total = tl.full((BLOCK_T,), 1.0, tl.float32)
    mean = tl.full((BLOCK_T,), 0.0, tl.float32)
    if NORMALIZE:
        total = tl.full((BLOCK_T,), 0.0, tl.float32)
        for k in range(TOP_K):
            pick = tl.load(index_ptr + picks + k, mask=row_ok, other=0)
            g = tl.load(grad_ptr + grads + k * stride_grad_col, mask=row_ok, other=0.0).to(tl.float32)
            p_k = tl.reduce(tl.where(cols[None, :] == pick[:, None], p, 0.0), 1, sum_combine)
            total += p_k
            mean += g * p_k
        total = tl.where(row_ok, total, 1.0)
        mean = mean / total
    d_p = tl.full((BLOCK_T, BLOCK_E), 0.0, tl.float32)
    for k in range(TOP_K):
        pick = tl.load(index_ptr + picks + k, mask=row_ok, other=0)
        g = tl.load(grad_ptr + grads + k * stride_grad_col, mask=row_ok, other=0.0).to(tl.float32)
        d_p = tl.where(cols[None, :] == pick[:, None], ((g - mean) / total)[:, None], d_p)
    # softmax backward: d z = p * (d p - <p, d p>)
    d_z = p * (d_p - tl.reduce(p * d_p, 1, sum_combine)[:, None])
    tl.store(
        d_logits_ptr + rows.to(tl.int64)[:, None] * stride_d_row + cols[None, :],
        d_z.to(d_logits_ptr.dtype.element_ty),
        mask=mask,
    )


def _blocks(n_experts: int) -> tuple[int, int]:
    block_e = next_power_of_2(n_experts)
    return max(1, _BLOCK_VALUES // block_e), block_e


def router_top_k_forward(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: (T, E) logits -> ((T, k) weights in logits' dtype, (T, k) int64 expert ids)."""
    rows, n_experts = logits.shape
    weights = torch.empty(rows, top_k, device=logits.device, dtype=logits.dtype)
    index = torch.empty(rows, top_k, device=logits.device, dtype=torch.int64)
    if rows:
        block_t, block_e = _blocks(n_experts)
        launcher(_router_top_k_forward_kernel, logits.device)[(cdiv(rows, block_t),)](
            logits,
            weights,
            index,
            rows,
            n_experts,
            logits.stride(0),
            TOP_K=top_k,
            NORMALIZE=bool(normalize),
            BLOCK_T=block_t,
            BLOCK_E=block_e,
            NEG=_NEG,
            num_warps=_NUM_WARPS,
        )
    return weights, index


def router_top_k_backward(
    logits: torch.Tensor, index: torch.Tensor, d_weights: torch.Tensor, normalize: bool
) -> torch.Tensor:
    """Launch the backward kernel: the gradient of the (T, E) logits (their dtype) from that of the weights."""
    rows, n_experts = logits.shape
    d_logits = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if rows:
        block_t, block_e = _blocks(n_experts)
        launcher(_router_top_k_backward_kernel, logits.device)[(cdiv(rows, block_t),)](
            logits,
            index,
            d_weights,
            d_logits,
            rows,
            n_experts,
            logits.stride(0),
            d_weights.stride(0),
            d_weights.stride(1),
            d_logits.stride(0),
            TOP_K=index.shape[1],
            NORMALIZE=bool(normalize),
            BLOCK_T=block_t,
            BLOCK_E=block_e,
            NEG=_NEG,
            num_warps=_NUM_WARPS,
        )
    return d_logits


class RouterTopKFunction(torch.autograd.Function):
    """Autograd for `router_top_k` on (T, E) logits: (T, k) weights in the logits' dtype, (T, k) int64 expert ids.

    Qwen-style routers (Qwen2-MoE, Qwen3-MoE, ...) turn their (T, E) logits into routing weights as

        p = softmax(logits) in float32;  (w, index) = topk(p, k);  w /= sum(w) when normalizing;  w in logits' dtype.

    Eagerly that is five kernels forward (softmax, topk, sum, divide, cast) and more backward, per layer, per pass;
    with a (T, E) float32 copy of the probabilities kept for backward. Here each direction is one launch: forward
    reads the logits once and writes w and index; backward recomputes p from the saved logits (E values per row) and
    writes the logits' gradient. Ties pick the lower expert id (`torch.topk` leaves the order of equal values
    unspecified).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, top_k: int, normalize: bool):
        weights, index = router_top_k_forward(logits, top_k, normalize)
        ctx.save_for_backward(logits, index)
        ctx.normalize = normalize
        ctx.mark_non_differentiable(index)
        return weights, index

    @staticmethod
    @once_differentiable
    def backward(ctx, d_weights: torch.Tensor, _d_index):
        logits, index = ctx.saved_tensors
        return router_top_k_backward(logits, index, d_weights, ctx.normalize), None, None


def router_top_k_reference(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' Qwen-style router after its linear layer, in torch (autograd through it)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, index = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), index


def router_top_k(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (T, k) in logits' dtype, expert ids (T, k) int64) of (T, E) router logits, largest first.

    The kernels run where Triton does (`use_triton`) for up to 1,024 experts; elsewhere the torch reference.
    """
    n_experts = logits.shape[-1]
    if not 0 < top_k <= n_experts:
        raise ValueError(f"top_k = {top_k} must be in [1, {n_experts}] (the number of experts)")
    if (
        logits.dim() != 2
        or n_experts > _MAX_EXPERTS
        or max_combine is None
        or logits.stride(-1) != 1
        or not use_triton(logits)
    ):
        return router_top_k_reference(logits, top_k, normalize)
    if torch.is_grad_enabled() and logits.requires_grad:
        return RouterTopKFunction.apply(logits, int(top_k), bool(normalize))
    return router_top_k_forward(logits, int(top_k), bool(normalize))

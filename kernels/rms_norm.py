"""RMSNorm, optionally fused with the residual add before it, forward and backward in Triton.

Naming chain: `_rms_norm_forward_kernel` / `_rms_norm_backward_kernel` (Triton) -> `rms_norm_forward` /
`rms_norm_backward` (launchers) -> `RMSNormFunction` / `AddRMSNormFunction` (autograd) -> `rms_norm` /
`add_rms_norm` (entry, with the torch fallback) -> `FusedRMSNorm` (module that replaces a model's norm).

Both weight styles of the supported families are computed with transformers' intermediate roundings:
"llama" rounds the normalized row to the input dtype before scaling, "gemma" scales by (1 + weight) in fp32.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import cdiv, launcher, next_power_of_2, num_programs, sum_combine, use_triton
from hone.kernels._triton import tl, triton
from hone.kernels.reference import add_rms_norm_reference, rms_norm_reference

# Whole rows live in registers; past this width they would spill, so wider rows use the reference.
MAX_COLS = 32768
# Elements one program normalizes: several short rows (q/k norms over head_dim=128) per program keep enough
# loads in flight per SM; long rows (hidden 4096+) take one program each.
_ELEMENTS_PER_PROGRAM = 4096
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_forward_kernel(
    x_ptr,
    residual_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    stride_x,
    stride_residual,
    stride_y,
    stride_h,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GEMMA: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = (pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_COLS)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual + cols[None, :], mask=mask, other=0.0)
        # Rounded like torch's `residual + x` in the activation dtype: this is the residual stream's next value.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rows[:, None] * stride_h + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    mean_square = tl.reduce(xf * xf, 1, sum_combine) / n_cols
    rstd = tl.math.rsqrt(mean_square + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_mask)
    normed = xf * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if GEMMA:  # noqa: SIM108 - a compile-time branch reads clearer as a statement in a kernel
        y = normed * (1.0 + w[None, :])
    else:
        y = normed.to(x_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_backward_kernel(
    dy_ptr,
    dh_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    n_rows,
    n_cols,
    stride_dy,
    stride_dh,
    stride_x,
    stride_dx,
    n_programs,
    HAS_DRESIDUAL: tl.constexpr,
    GEMMA: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = 1.0 + w
    dw_acc = tl.full([BLOCK_COLS], 0.0, tl.float32)
    n_blocks = (n_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
    for block in tl.range(pid, n_blocks, n_programs):
        rows = (block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        normed = x.to(tl.float32) * rstd[:, None]
        dnormed = dy * w[None, :]
        dot = tl.reduce(dnormed * normed, 1, sum_combine) / n_cols
        dx = (dnormed - normed * dot[:, None]) * rstd[:, None]
        if HAS_DRESIDUAL:
            dx += tl.load(dh_ptr + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            if GEMMA:
                dw_acc += tl.reduce(dy * normed, 0, sum_combine)
            else:
                dw_acc += tl.reduce(dy * normed.to(x_ptr.dtype.element_ty).to(tl.float32), 0, sum_combine)
    if COMPUTE_DW:
        tl.store(dw_partial_ptr + pid * n_cols + cols, dw_acc, mask=col_mask)


def _launch_config(n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps) for rows of `n_cols` elements."""
    block_cols = next_power_of_2(n_cols)
    block_rows = max(1, _ELEMENTS_PER_PROGRAM // block_cols)
    elements = block_rows * block_cols
    # About 8-16 elements per thread: enough independent loads to cover HBM latency without spilling registers.
    num_warps = 4 if elements <= 2048 else 8 if elements <= 8192 else 16 if elements <= 16384 else 32
    return block_rows, block_cols, num_warps


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., N) -> (M, N) with unit column stride (a view when possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _output_dtype(x: torch.Tensor, weight: torch.Tensor, style: str) -> torch.dtype:
    return x.dtype if style == "gemma" else torch.promote_types(x.dtype, weight.dtype)


def rms_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    style: str = "llama",
    residual: torch.Tensor | None = None,
    shape: tuple[int, ...] | None = None,
):
    """Launch the forward kernel.

    Args:
        x: (M, N) with unit column stride; weight: (N,).
        residual: optional (M, N) added to `x` first (same dtype as x).
        shape: the shape (..., N) to give the outputs (default (M, N)); they are allocated in it rather than
            viewed, so that callers may later write into views of them in place.

    Returns:
        (y, rstd, h): y normalized; rstd (M,) fp32; h = residual + x, or None without residual.
    """
    n_rows, n_cols = x.shape
    shape = shape or (n_rows, n_cols)
    block_rows, block_cols, num_warps = _launch_config(n_cols)
    y = torch.empty(shape, dtype=_output_dtype(x, weight, style), device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    h = torch.empty(shape, dtype=x.dtype, device=x.device) if residual is not None else None
    y2, h2 = y.view(n_rows, n_cols), h.view(n_rows, n_cols) if h is not None else None
    grid = (cdiv(n_rows, block_rows),)
    launcher(_rms_norm_forward_kernel, x.device)[grid](
        x,
        residual if residual is not None else x,
        weight,
        y2,
        h2 if h2 is not None else y2,
        rstd,
        n_rows,
        n_cols,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        y2.stride(0),
        h2.stride(0) if h2 is not None else 0,
        eps,
        HAS_RESIDUAL=residual is not None,
        GEMMA=style == "gemma",
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        num_warps=num_warps,
    )
    return y, rstd, h


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    style: str,
    compute_dw: bool,
    dh: torch.Tensor | None = None,
    shape: tuple[int, ...] | None = None,
):
    """Launch the backward kernel.

    Args:
        dy: (M, N) gradient of the normalized output; x: (M, N) the normalized input (h when fused).
        dh: optional (M, N) gradient reaching h directly (the residual stream), added to dx.
        shape: the shape (..., N) to allocate dx in (default (M, N)).

    Returns:
        (dx, dw): dx in x's dtype; dw (N,) in weight's dtype, or None.
    """
    n_rows, n_cols = x.shape
    block_rows, block_cols, num_warps = _launch_config(n_cols)
    programs = num_programs(x.device, cdiv(n_rows, block_rows))
    dx = torch.empty(shape or x.shape, dtype=x.dtype, device=x.device)
    dx2 = dx.view(n_rows, n_cols)
    dw_partial = torch.empty((programs, n_cols), dtype=torch.float32, device=x.device) if compute_dw else rstd
    launcher(_rms_norm_backward_kernel, x.device)[(programs,)](
        dy,
        dh if dh is not None else dy,
        x,
        weight,
        rstd,
        dx2,
        dw_partial,
        n_rows,
        n_cols,
        dy.stride(0),
        dh.stride(0) if dh is not None else 0,
        x.stride(0),
        dx2.stride(0),
        programs,
        HAS_DRESIDUAL=dh is not None,
        GEMMA=style == "gemma",
        COMPUTE_DW=compute_dw,
        BLOCK_ROWS=block_rows,
        BLOCK_COLS=block_cols,
        num_warps=num_warps,
    )
    dw = dw_partial.sum(0).to(weight.dtype) if compute_dw else None
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    """Autograd for `rms_norm`: x (..., N), weight (N,) -> (..., N). Backward saves the input and one fp32 rstd per
    row; nothing else."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, style: str) -> torch.Tensor:
        x2 = _rows(x)
        y, rstd, _ = rms_norm_forward(x2, weight, eps, style, shape=x.shape)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.style = style
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(_rows(dy), x2, weight, rstd, ctx.style, ctx.needs_input_grad[1], shape=dy.shape)
        return dx, dw, None, None


class AddRMSNormFunction(torch.autograd.Function):
    """Autograd for `add_rms_norm`: (residual, x) (..., N) -> (h, y). Backward saves h and one fp32 rstd per row."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, style: str):
        y, rstd, h = rms_norm_forward(_rows(x), weight, eps, style, residual=_rows(residual), shape=x.shape)
        ctx.save_for_backward(h.view(-1, h.shape[-1]), weight, rstd)
        ctx.style = style
        return h, y

    @staticmethod
    def backward(ctx, dh: torch.Tensor, dy: torch.Tensor):
        h2, weight, rstd = ctx.saved_tensors
        dsum, dw = rms_norm_backward(
            _rows(dy), h2, weight, rstd, ctx.style, ctx.needs_input_grad[2], dh=_rows(dh), shape=dy.shape
        )
        return dsum, dsum, dw, None, None


def _supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.dtype in _FLOAT_DTYPES
        and weight.dtype in _FLOAT_DTYPES
        and weight.dim() == 1
        and x.shape[-1] == weight.shape[0]
        and 0 < x.shape[-1] <= MAX_COLS
        and x.numel() > 0
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, style: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension of `x` (..., N); the Triton kernel where it runs, else the reference."""
    if use_triton(x, weight) and _supported(x, weight):
        if not torch.is_grad_enabled():  # (a checkpointed forward) no autograd node: less host time per call
            return rms_norm_forward(_rows(x), weight, eps, style, shape=x.shape)[0]
        return RMSNormFunction.apply(x, weight, eps, style)
    return rms_norm_reference(x, weight, eps, style)


def add_rms_norm(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, style: str = "llama"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = residual + x; return h, rms_norm(h)` in one pass over memory."""
    if (
        use_triton(residual, x, weight)
        and _supported(x, weight)
        and residual.shape == x.shape
        and residual.dtype == x.dtype
    ):
        if not torch.is_grad_enabled():
            y, _, h = rms_norm_forward(_rows(x), weight, eps, style, residual=_rows(residual), shape=x.shape)
            return h, y
        return AddRMSNormFunction.apply(residual, x, weight, eps, style)
    return add_rms_norm_reference(residual, x, weight, eps, style)


class FusedRMSNorm(torch.nn.Module):
    """Stands in for a model's RMSNorm module, holding the very same weight Parameter (state dicts match).

    Args:
        weight: the replaced module's (N,) weight Parameter, shared, not copied.
        eps: its epsilon.
        style: "llama" or "gemma" (see `hone.kernels.reference.rms_norm_reference`).
    """

    def __init__(self, weight: torch.nn.Parameter, eps: float, style: str = "llama"):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)
        self.style = style

    @property
    def variance_epsilon(self) -> float:
        return self.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.style)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, style={self.style}"

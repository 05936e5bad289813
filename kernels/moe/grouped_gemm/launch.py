"""Grouped GEMM launchers for mixture-of-experts layers, and their plain-torch references.

Naming chain: `_grouped_gemm_kernel` / `_grouped_gemm_wgrad_kernel` (Triton, kernels.py) -> `grouped_gemm_forward` /
`grouped_gemm_wgrad` (launchers) -> `TritonOps` (`hone.kernels.moe.backends`) -> `MoeExpertsFunction` (autograd,
`hone.kernels.moe.experts`). Rows are sorted by expert and `group_ends` (int32, (E,), on the device) holds each
expert's cumulative row count; neither launcher reads a size back to the host. The references
(`grouped_gemm_reference`, `grouped_gemm_wgrad_reference`) loop over experts in float32; the kernels are tested
against them.
"""

from __future__ import annotations

import torch

from hone.kernels._runtime import cdiv, launcher, next_power_of_2
from hone.kernels.moe.grouped_gemm.tuning import KernelConfig, pick_config

try:
    import triton

    from hone.kernels.moe.grouped_gemm.kernels import _grouped_gemm_kernel, _grouped_gemm_wgrad_kernel
except ImportError:  # a machine without Triton: the references and the other MoE backends still work
    triton = None


def interpreting() -> bool:
    """Whether the kernels were built for Triton's CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return triton is not None and type(_grouped_gemm_kernel).__name__ == "InterpretedFunction"


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of this device (a CUDA GPU, or the CPU interpreter)."""
    if triton is None:
        return False
    device = torch.device(device)
    if interpreting():
        return device.type == "cpu"
    return device.type == "cuda"


def _dot_options(dtype: torch.dtype) -> dict:
    upcast = interpreting() and dtype != torch.float32
    # float32 operands get exact products ("ieee") so float32 runs match the reference; tf32 would drop 13 bits.
    return {"DOT_PRECISION": "ieee" if dtype == torch.float32 or upcast else "tf32", "UPCAST": upcast}


def _group_tile_ends(group_ends: torch.Tensor, block_m: int, cache: dict | None) -> torch.Tensor:
    """Cumulative count of BLOCK_M row tiles per group (int32, (E,)), computed on the device."""
    key = ("tile_ends", block_m)
    if cache is not None and key in cache:
        return cache[key]
    counts = torch.diff(group_ends, prepend=group_ends.new_zeros(1))
    tile_ends = torch.cumsum(torch.div(counts + (block_m - 1), block_m, rounding_mode="floor"), 0, dtype=torch.int32)
    if cache is not None:
        cache[key] = tile_ends
    return tile_ends


def grouped_gemm_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    gather: torch.Tensor | None = None,
    scatter: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    lora_x: torch.Tensor | None = None,
    lora_w: torch.Tensor | None = None,
    lora_scale: float = 1.0,
    num_rows: int | None = None,
    cache: dict | None = None,
) -> torch.Tensor:
    """Grouped x @ w[e] with the MoE gather, LoRA term, bias, routing weight and scatter fused in.

    Args:
        x: (R, K) rows; with `gather`, sorted row s reads x[gather[s]], else x is already in sorted order.
        w: (E, K, N), any strides (the dtype of x): weights are read through their strides, so a transposed view
            (e.g. a (E, N, K) parameter seen as (E, K, N)) costs no copy.
        group_ends: (E,) int32 cumulative rows per expert; the last entry is the number of sorted rows S.
        gather: (S,) int64 source row of each sorted row, or None.
        scatter: (S,) int64 destination row of each sorted row (a permutation of range(S)), or None.
        row_scale: (S,) per sorted row multiplier applied last (the routing weight), or None.
        bias: (E, N) added per expert, or None.
        lora_x: (S, r) sorted rows of the LoRA down-projection, with lora_w (E, r, N): adds
            lora_scale * lora_x[rows of e] @ lora_w[e].
        num_rows: S, when x is gathered (defaults to x's row count).
        cache: a per-routing dict for device tensors derived from group_ends (reused across calls).

    Returns:
        (S, N) in x's dtype, rows in sorted order (or placed by `scatter`).
    """
    num_groups, k_dim, n_cols = w.shape
    rows = x.shape[0] if num_rows is None else num_rows
    out = torch.empty(rows, n_cols, device=x.device, dtype=x.dtype)
    if rows == 0 or n_cols == 0 or x.device.type == "meta":  # meta tensors (memory plans) carry shapes only
        return out
    rank = lora_x.shape[1] if lora_x is not None else 0
    flags = (gather is not None, scatter is not None, row_scale is not None, bias is not None, lora_x is not None)

    def launch(cfg: KernelConfig) -> None:
        tile_ends = _group_tile_ends(group_ends, cfg.block_m, cache)
        grid = (cdiv(rows, cfg.block_m) + num_groups, cdiv(n_cols, cfg.block_n))
        dummy = x
        lx = lora_x if lora_x is not None else x
        lw = lora_w if lora_w is not None else w
        bs = bias if bias is not None else w
        launcher(_grouped_gemm_kernel, x.device)[grid](
            x,
            w,
            out,
            group_ends,
            tile_ends,
            gather if gather is not None else dummy,
            scatter if scatter is not None else dummy,
            row_scale if row_scale is not None else dummy,
            bs,
            lx,
            lw,
            num_groups,
            n_cols,
            k_dim,
            rank,
            float(lora_scale),
            x.stride(0),
            x.stride(1),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            out.stride(0),
            out.stride(1),
            bs.stride(0),
            bs.stride(-1),
            lx.stride(0),
            lx.stride(1),
            lw.stride(0),
            lw.stride(1),
            lw.stride(2),
            HAS_GATHER=flags[0],
            HAS_SCATTER=flags[1],
            HAS_ROW_SCALE=flags[2],
            HAS_BIAS=flags[3],
            HAS_LORA=flags[4],
            **_dot_options(x.dtype),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            BLOCK_R=max(16, next_power_of_2(max(rank, 1))),
            BLOCK_G=next_power_of_2(num_groups),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )

    cfg = pick_config("forward", x.device, x.dtype, rows, n_cols, k_dim, flags, launch, interpreting())
    launch(cfg)
    return out


def grouped_gemm_wgrad(
    p: torch.Tensor,
    q: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    gather_p: torch.Tensor | None = None,
    gather_q: torch.Tensor | None = None,
    num_rows: int | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-expert p[rows of e]^T @ q[rows of e]: gradients of expert weights and LoRA factors.

    Args:
        p: (R, M) rows (gathered through `gather_p` when given, else in sorted order).
        q: (R', N) rows (gathered through `gather_q` when given), the dtype of p.
        group_ends: (E,) int32 cumulative rows per expert.
        num_rows: unused by the kernel (the groups give the rows); kept for symmetry with the reference.
        out_dtype: accumulation is float32; the result is stored in this dtype.

    Returns:
        (E, M, N); experts with no rows get zeros.
    """
    num_groups = group_ends.shape[0]
    m_dim, n_dim = p.shape[1], q.shape[1]
    out = torch.empty(num_groups, m_dim, n_dim, device=p.device, dtype=out_dtype)
    if m_dim == 0 or n_dim == 0 or num_groups == 0:
        return out.zero_()
    if p.device.type == "meta":  # meta tensors (memory plans) carry shapes only
        return out
    rows = p.shape[0] if num_rows is None else num_rows
    flags = (gather_p is not None, gather_q is not None)

    def launch(cfg: KernelConfig) -> None:
        grid = (cdiv(m_dim, cfg.block_m) * cdiv(n_dim, cfg.block_n), num_groups)
        launcher(_grouped_gemm_wgrad_kernel, p.device)[grid](
            p,
            q,
            out,
            group_ends,
            gather_p if gather_p is not None else p,
            gather_q if gather_q is not None else q,
            m_dim,
            n_dim,
            p.stride(0),
            p.stride(1),
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            out.stride(2),
            HAS_GATHER_P=flags[0],
            HAS_GATHER_Q=flags[1],
            **_dot_options(p.dtype),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )

    cfg = pick_config("wgrad", p.device, p.dtype, rows, m_dim, n_dim, flags, launch, interpreting())
    launch(cfg)
    return out


def _bounds(group_ends: torch.Tensor) -> list[tuple[int, int]]:
    ends = group_ends.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def grouped_gemm_reference(
    x: torch.Tensor,
    w: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    gather: torch.Tensor | None = None,
    scatter: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    lora_x: torch.Tensor | None = None,
    lora_w: torch.Tensor | None = None,
    lora_scale: float = 1.0,
) -> torch.Tensor:
    """`grouped_gemm_forward` computed expert by expert in float32 (returns float32)."""
    rows = x[gather] if gather is not None else x
    out = torch.zeros(rows.shape[0], w.shape[2], dtype=torch.float32, device=x.device)
    for e, (begin, end) in enumerate(_bounds(group_ends)):
        block = rows[begin:end].float() @ w[e].float()
        if lora_x is not None:
            block = block + lora_scale * (lora_x[begin:end].float() @ lora_w[e].float())
        if bias is not None:
            block = block + bias[e].float()
        out[begin:end] = block
    if row_scale is not None:
        out = out * row_scale.float()[:, None]
    if scatter is not None:
        placed = torch.empty_like(out)
        placed[scatter] = out
        out = placed
    return out


def grouped_gemm_wgrad_reference(
    p: torch.Tensor,
    q: torch.Tensor,
    group_ends: torch.Tensor,
    *,
    gather_p: torch.Tensor | None = None,
    gather_q: torch.Tensor | None = None,
) -> torch.Tensor:
    """`grouped_gemm_wgrad` computed expert by expert in float32 (returns float32)."""
    p_rows = p[gather_p] if gather_p is not None else p
    q_rows = q[gather_q] if gather_q is not None else q
    out = torch.zeros(group_ends.shape[0], p.shape[1], q.shape[1], dtype=torch.float32, device=p.device)
    for e, (begin, end) in enumerate(_bounds(group_ends)):
        out[e] = p_rows[begin:end].float().T @ q_rows[begin:end].float()
    return out


__all__ = [
    "grouped_gemm_forward",
    "grouped_gemm_reference",
    "grouped_gemm_wgrad",
    "grouped_gemm_wgrad_reference",
    "interpreting",
    "triton_runs_on",
]

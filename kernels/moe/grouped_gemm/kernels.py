"""Triton grouped GEMMs for mixture-of-experts layers: rows sorted by expert, one weight matrix per expert.

Both kernels are driven by `group_ends` (int32, (E,)), the cumulative row count of each expert's group: group e
owns sorted rows [group_ends[e-1], group_ends[e]). Nothing here reads sizes on the host. `_grouped_gemm_kernel` is
the forward product with the token gather, LoRA term, bias, routing weight and scatter fused in;
`_grouped_gemm_wgrad_kernel` the per-group reduction that gives weight and LoRA-factor gradients. Launchers (block
sizes, the per-group tile prefix, the naming chain): `hone.kernels.moe.grouped_gemm.launch`.
"""

from __future__ import annotations

from hone.kernels._triton import tl, triton


@triton.jit
def _grouped_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    group_ends_ptr,
    tile_ends_ptr,
    gather_ptr,
    scatter_ptr,
    row_scale_ptr,
    bias_ptr,
    lora_x_ptr,
    lora_w_ptr,
    num_groups,
    n_cols,
    k_dim,
    lora_rank,
    lora_scale,
    stride_xm,
    stride_xk,
    stride_we,
    stride_wk,
    stride_wn,
    stride_om,
    stride_on,
    stride_be,
    stride_bn,
    stride_lxm,
    stride_lxr,
    stride_lwe,
    stride_lwr,
    stride_lwn,
    HAS_GATHER: tl.constexpr,
    HAS_SCATTER: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) output tile of one expert group.

    out[rows of e] = x[rows of e] @ w[e] (+ scale * lora_x @ lora_w[e]) (+ bias[e]), optionally gathering x's rows
    through an index (HAS_GATHER: the token gather of the router, fused into the loads) and scattering output rows
    through an index with a per-row scale (HAS_SCATTER, HAS_ROW_SCALE: the routing weight, fused into the stores).
    UPCAST (set only under Triton's CPU interpreter, whose bf16 `tl.dot` returns garbage on Triton 3.9) converts the
    operands to float32 before each dot; bf16/fp16 products are exact in float32, so the result is the same sum.

    Axis 0 enumerates row tiles of all groups back to back (`tile_ends` is their cumulative count per group, so
    the grid's upper bound cdiv(S, BLOCK_M) + E needs no host sync); programs past the last tile do nothing.
    Axis 1 enumerates column tiles.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    groups = tl.arange(0, BLOCK_G)
    tile_ends = tl.load(tile_ends_ptr + groups, mask=groups < num_groups, other=0x7FFFFFFF)
    total_tiles = tl.load(tile_ends_ptr + num_groups - 1)
    if pid_m < total_tiles:
        group = tl.sum((tile_ends <= pid_m).to(tl.int32), axis=0)
        first_tile = tl.load(tile_ends_ptr + group - 1, mask=group > 0, other=0)
        group_begin = tl.load(group_ends_ptr + group - 1, mask=group > 0, other=0)
        group_end = tl.load(group_ends_ptr + group)
        rows = group_begin + (pid_m - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < group_end
        rows64 = rows.to(tl.int64)
        if HAS_GATHER:  # noqa: SIM108 - a branch on a constexpr reads clearer in a kernel
            src_rows = tl.load(gather_ptr + rows64, mask=row_mask, other=0).to(tl.int64)
        else:
            src_rows = rows64
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        group64 = group.to(tl.int64)

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_group = w_ptr + group64 * stride_we
        for k0 in range(0, k_dim, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_mask = ks < k_dim
            a = tl.load(
                x_ptr + src_rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                mask=row_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            b = tl.load(
                w_group + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                mask=k_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            if UPCAST:
                a, b = a.to(tl.float32), b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

        if HAS_LORA:
            lora_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            lora_group = lora_w_ptr + group64 * stride_lwe
            for r0 in range(0, lora_rank, BLOCK_R):
                rs = r0 + tl.arange(0, BLOCK_R)
                r_mask = rs < lora_rank
                la = tl.load(
                    lora_x_ptr + rows64[:, None] * stride_lxm + rs[None, :] * stride_lxr,
                    mask=row_mask[:, None] & r_mask[None, :],
                    other=0.0,
                )
                lb = tl.load(
                    lora_group + rs[:, None] * stride_lwr + cols[None, :] * stride_lwn,
                    mask=r_mask[:, None] & col_mask[None, :],
                    other=0.0,
                )
                if UPCAST:
                    la, lb = la.to(tl.float32), lb.to(tl.float32)
                lora_acc = tl.dot(la, lb, lora_acc, input_precision=DOT_PRECISION)
            acc += lora_acc * lora_scale

        if HAS_BIAS:
            bias = tl.load(bias_ptr + group64 * stride_be + cols * stride_bn, mask=col_mask, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        if HAS_ROW_SCALE:
            scale = tl.load(row_scale_ptr + rows64, mask=row_mask, other=0.0)
            acc = acc * scale.to(tl.float32)[:, None]
        if HAS_SCATTER:  # noqa: SIM108 - a branch on a constexpr reads clearer in a kernel
            dst_rows = tl.load(scatter_ptr + rows64, mask=row_mask, other=0).to(tl.int64)
        else:
            dst_rows = rows64
        tl.store(
            out_ptr + dst_rows[:, None] * stride_om + cols[None, :] * stride_on,
            acc.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & col_mask[None, :],
        )


@triton.jit
def _grouped_gemm_wgrad_kernel(
    p_ptr,
    q_ptr,
    out_ptr,
    group_ends_ptr,
    gather_p_ptr,
    gather_q_ptr,
    m_dim,
    n_dim,
    stride_pm,
    stride_pk,
    stride_qm,
    stride_qn,
    stride_oe,
    stride_om,
    stride_on,
    HAS_GATHER_P: tl.constexpr,
    HAS_GATHER_Q: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One (BLOCK_M, BLOCK_N) tile of out[e] = p[rows of e]^T @ q[rows of e]; an empty group writes zeros.

    The reduction over each group's rows that gives weight (and LoRA factor) gradients; either operand's rows may be
    gathered (HAS_GATHER_P, HAS_GATHER_Q). UPCAST as in `_grouped_gemm_kernel`.
    Axis 0 enumerates output tiles, axis 1 the groups. The loop runs over the group's rows in BLOCK_K steps.
    """
    pid = tl.program_id(0)
    group = tl.program_id(1)
    tiles_n = tl.cdiv(n_dim, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    group_begin = tl.load(group_ends_ptr + group - 1, mask=group > 0, other=0)
    group_end = tl.load(group_ends_ptr + group)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = ms < m_dim
    n_mask = ns < n_dim

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(group_begin, group_end, BLOCK_K):
        rows = k0 + tl.arange(0, BLOCK_K)
        row_mask = rows < group_end
        rows64 = rows.to(tl.int64)
        if HAS_GATHER_P:  # noqa: SIM108 - a branch on a constexpr reads clearer in a kernel
            p_rows = tl.load(gather_p_ptr + rows64, mask=row_mask, other=0).to(tl.int64)
        else:
            p_rows = rows64
        if HAS_GATHER_Q:  # noqa: SIM108 - a branch on a constexpr reads clearer in a kernel
            q_rows = tl.load(gather_q_ptr + rows64, mask=row_mask, other=0).to(tl.int64)
        else:
            q_rows = rows64
        a = tl.load(
            p_ptr + p_rows[None, :] * stride_pm + ms[:, None] * stride_pk,
            mask=m_mask[:, None] & row_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            q_ptr + q_rows[:, None] * stride_qm + ns[None, :] * stride_qn,
            mask=row_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    out = out_ptr + group.to(tl.int64) * stride_oe
    tl.store(
        out + ms[:, None] * stride_om + ns[None, :] * stride_on,
        acc.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )

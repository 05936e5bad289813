"""The grouped-GEMM primitives of the MoE experts computation, one class per backend, all behind `GroupedOps`.

Every backend offers `gmm` (one product per expert over its sorted rows) and `wgrad` (per-expert weight gradients).
`TritonOps` fuses the gather, LoRA term, bias, routing weight and scatter into its kernels; `GroupedMmOps`
(torch._grouped_mm) and `TorchLoopOps` (a loop over the groups) apply them with indexing around the GEMMs. Only
`TorchLoopOps` reads the group sizes on the host (once per layer call).
"""

from __future__ import annotations

from typing import Protocol

import torch

from hone.kernels.moe.routing import Routing

Lora = tuple[torch.Tensor, torch.Tensor, float]  # (lora_x (S, r), lora_w (E, r, N), scale)


class GroupedOps(Protocol):
    """The two operations every backend offers on expert-sorted rows (see `hone.kernels.moe.routing.Routing`).

    - `gmm(x, w, routing, ...)`: out[rows of e] = x[rows of e] @ w[e], with the router's token gather, a LoRA term,
      a per-expert bias, the routing weight and the scatter back to (token, slot) order as options. x: (T, K) with
      `gather`, else (S, K); w: (E, K, N); `lora`: (lora_x (S, r), lora_w (E, r, N), scale); bias: (E, N);
      row_scale: (S,). Returns (S, N).
    - `wgrad(p, q, routing, ...)`: out[e] = p[rows of e]^T @ q[rows of e] (weight and LoRA-factor gradients).
      p: (S or T, M), q: (S or T, N), gathered through the router's token index with `gather_p` / `gather_q`.
      Returns (E, M, N); experts with no rows get zeros.
    """

    name: str
    rank_multiple: int  # LoRA ranks are zero-padded to a multiple of this (alignment of the GEMM operands)
    fuses_gather: bool  # gathers rows inside its GEMMs (else callers gather once and pass sorted rows)

    def gmm(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        routing: Routing,
        *,
        gather: bool = False,
        scatter: bool = False,
        row_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        lora: Lora | None = None,
    ) -> torch.Tensor: ...

    def wgrad(
        self, p: torch.Tensor, q: torch.Tensor, routing: Routing, *, gather_p: bool = False, gather_q: bool = False
    ) -> torch.Tensor: ...


def _epilogue(
    out: torch.Tensor, routing: Routing, scatter: bool, row_scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    if bias is not None:
        out += bias[routing.expert.long()]
    if row_scale is not None:
        out.mul_(row_scale[:, None])
    if scatter:
        out = torch.empty_like(out).index_copy_(0, routing.perm, out)
    return out


class TorchLoopOps:
    """A matmul per expert over its slice of the sorted rows: plain PyTorch, any device and dtype."""

    name = "torch"
    rank_multiple = 1
    fuses_gather = False

    def gmm(self, x, w, routing, *, gather=False, scatter=False, row_scale=None, bias=None, lora=None):
        """See `GroupedOps`. x: (T, K) with gather, else (S, K); w: (E, K, N) -> (S, N)."""
        rows = x[routing.token] if gather else x
        out = rows.new_empty(routing.num_rows, w.shape[2])
        for e, (begin, end) in enumerate(routing.bounds()):
            if begin == end:
                continue
            block = out[begin:end]
            torch.mm(rows[begin:end], w[e], out=block)
            if lora is not None:
                block.addmm_(lora[0][begin:end], lora[1][e], alpha=lora[2])
        return _epilogue(out, routing, scatter, row_scale, bias)

    def wgrad(self, p, q, routing, *, gather_p=False, gather_q=False):
        """p: (S or T, M), q: (S or T, N) -> (E, M, N) in p's dtype; empty experts get zeros."""
        p_rows = p[routing.token] if gather_p else p
        q_rows = q[routing.token] if gather_q else q
        out = p.new_zeros(routing.num_experts, p.shape[1], q.shape[1])
        for e, (begin, end) in enumerate(routing.bounds()):
            if begin != end:
                torch.mm(p_rows[begin:end].T, q_rows[begin:end], out=out[e])
        return out


def _aligned(*tensors: torch.Tensor) -> bool:
    """torch._grouped_mm's layout rule: 16-byte aligned base, one unit stride in the last two dims, the other
    stride a multiple of 16 bytes."""
    for t in tensors:
        if t.data_ptr() % 16:
            return False
        s1, s2 = t.stride()[-2:]
        lead = s1 if s2 == 1 else s2 if s1 == 1 else None
        if lead is None or (lead * t.element_size()) % 16:
            return False
    return True


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    fn = getattr(torch.nn.functional, "grouped_mm", None)  # public name from torch 2.10
    return fn(a, b, offs=offs) if fn is not None else torch._grouped_mm(a, b, offs=offs)


class GroupedMmOps:
    """torch._grouped_mm (CUTLASS on sm80+): one launch per GEMM, no host sync.

    Shapes whose rows are not 16-byte aligned (odd hidden sizes) go to `TorchLoopOps` for that GEMM.
    """

    name = "grouped_mm"
    rank_multiple = 8  # a rank-r LoRA activation (S, r) needs r * 2 bytes % 16 == 0 in bf16/fp16
    fuses_gather = False

    def __init__(self) -> None:
        self._loop = TorchLoopOps()

    def gmm(self, x, w, routing, *, gather=False, scatter=False, row_scale=None, bias=None, lora=None):
        rows = x[routing.token] if gather else x
        out_bytes = w.shape[2] * rows.element_size()
        operands = (rows, w) + ((lora[0], lora[1]) if lora is not None else ())
        if out_bytes % 16 or not _aligned(*operands):
            return self._loop.gmm(rows, w, routing, scatter=scatter, row_scale=row_scale, bias=bias, lora=lora)
        out = _grouped_mm(rows, w, routing.group_ends)
        if lora is not None:
            out.add_(_grouped_mm(lora[0], lora[1], routing.group_ends), alpha=lora[2])
        return _epilogue(out, routing, scatter, row_scale, bias)

    def wgrad(self, p, q, routing, *, gather_p=False, gather_q=False):
        p_rows = p[routing.token] if gather_p else p
        q_rows = q[routing.token] if gather_q else q
        if (q_rows.shape[1] * q_rows.element_size()) % 16 or not _aligned(p_rows.T, q_rows):
            return self._loop.wgrad(p_rows, q_rows, routing)
        out = _grouped_mm(p_rows.T, q_rows, routing.group_ends)
        # An expert with no rows must get a zero gradient; do not rely on the kernel writing it.
        return out.masked_fill_((routing.counts == 0)[:, None, None], 0)


class TritonOps:
    """Hone's Triton kernels (`hone.kernels.moe.grouped_gemm.launch`): gather, LoRA, bias, routing weight and scatter
    fused into the GEMMs, no host sync."""

    name = "triton"
    rank_multiple = 1
    fuses_gather = True

    def gmm(self, x, w, routing, *, gather=False, scatter=False, row_scale=None, bias=None, lora=None):
        from hone.kernels.moe.grouped_gemm.launch import grouped_gemm_forward

        return grouped_gemm_forward(
            x,
            w,
            routing.group_ends,
            gather=routing.token if gather else None,
            scatter=routing.perm if scatter else None,
            row_scale=row_scale,
            bias=bias,
            lora_x=lora[0] if lora is not None else None,
            lora_w=lora[1] if lora is not None else None,
            lora_scale=lora[2] if lora is not None else 1.0,
            num_rows=routing.num_rows,
            cache=routing.cache,
        )

    def wgrad(self, p, q, routing, *, gather_p=False, gather_q=False):
        from hone.kernels.moe.grouped_gemm.launch import grouped_gemm_wgrad

        return grouped_gemm_wgrad(
            p,
            q,
            routing.group_ends,
            gather_p=routing.token if gather_p else None,
            gather_q=routing.token if gather_q else None,
            num_rows=routing.num_rows,
        )


OPS: dict[str, type] = {"torch": TorchLoopOps, "grouped_mm": GroupedMmOps, "triton": TritonOps}


def make_ops(name: str) -> GroupedOps:
    """The backend called `name` ("torch", "grouped_mm" or "triton")."""
    return OPS[name]()

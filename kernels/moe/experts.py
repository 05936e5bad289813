"""One MoE experts layer as a single autograd function over grouped GEMMs, with split LoRA on the experts.

Each of the S = T * top_k expert-sorted rows computes `act(x[token] @ W_up[e] + LoRA) @ W_down[e] + LoRA`, and each
token sums its rows times its routing weights. W + s * A @ B is never formed: the LoRA factors act on the rows of
their own group. `moe_experts` is the entry (on any `GroupedOps` backend), `MoeExpertsFunction` the autograd (the
formulas and what backward keeps), `moe_experts_reference` the same layer expert by expert, for tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from hone.kernels.moe.backends import GroupedOps
from hone.kernels.moe.clamped_glu import ClampedGlu, clamped_glu, clamped_glu_grad
from hone.kernels.moe.glu import swiglu_halves, swiglu_halves_grad
from hone.kernels.moe.routing import Routing, route


@dataclass
class ExpertWeights:
    """An experts layer's weights as (E, K, N) views that rows multiply from the left (x @ w[e]).

    Attributes:
        up: (E, H, N1) gate and up projections in the layer's own column order (N1 = 2I), or the up projection
            alone for ungated experts (N1 = I).
        down: (E, I, H).
        up_bias: (E, N1) or None. down_bias: (E, H) or None.
        activation: (S, N1) -> (S, I), e.g. silu(gate) * up, or gpt-oss's clamped interleaved GLU.
        silu_halves: the activation is `silu(gate_up[:, :I]) * gate_up[:, I:]` (transformers' default gate with a
            silu act_fn, as Qwen-style experts have): its forward and backward then run fused
            (`hone.kernels.moe.glu`).
        clamped_glu: the activation is gpt-oss's clamped GLU on interleaved columns with these constants: fused
            too (`hone.kernels.moe.clamped_glu`). None otherwise.
    """

    up: torch.Tensor
    down: torch.Tensor
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    activation: Callable[[torch.Tensor], torch.Tensor]
    silu_halves: bool = False
    clamped_glu: ClampedGlu | None = None


@dataclass
class LoraFactors:
    """LoRA on one stacked expert weight: the update of expert e is scale * a[e] @ b[e].

    Attributes:
        a: (E, K, r) down-projection factors. b: (E, r, N) up-projection factors (any float dtype: they are cast
            to the compute dtype inside, and receive gradients in their own dtype).
        scale: alpha / r (or alpha / sqrt(r)).
        dropout: probability of dropping an element of the LoRA input while training.
    """

    a: torch.Tensor
    b: torch.Tensor
    scale: float
    dropout: float = 0.0


@dataclass
class _Plan:
    """The non-tensor arguments of one call."""

    routing: Routing
    ops: GroupedOps
    activation: Callable[[torch.Tensor], torch.Tensor]
    silu_halves: bool
    clamped_glu: ClampedGlu | None
    single_use: bool  # the graph is back-propagated exactly once (a checkpoint recompute): saved tensors may be reused
    up_scale: float
    down_scale: float
    up_dropout: float
    down_dropout: float
    up_seed: int
    down_seed: int


def _dropped(rows: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """rows * keep / (1 - p) with a keep mask drawn from `seed` (the same mask in forward and backward)."""
    gen = torch.Generator(device=rows.device)
    gen.manual_seed(seed)
    keep = torch.rand(rows.shape, generator=gen, device=rows.device) >= p
    return rows * keep / (1.0 - p)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """t in float32, or float64 if it already is (accumulations of small per-row sums)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _cast(t: torch.Tensor | None, dtype: torch.dtype, dense: bool = False) -> torch.Tensor | None:
    """t in dtype; `dense`: also contiguous, in the same copy (peft lays B out rank-major: a permuted view)."""
    if t is None:
        return None
    return t.to(dtype, memory_format=torch.contiguous_format) if dense else t.to(dtype)


def _sorted_source(t: torch.Tensor, routing: Routing, ops: GroupedOps) -> tuple[torch.Tensor, bool]:
    """(rows, gather flag) to pass to the backend: the (T, .) tensor itself when the backend gathers inside its
    GEMMs, else its rows copied into sorted order once, for all the GEMMs that read them."""
    return (t, True) if ops.fuses_gather else (t[routing.token], False)


# The scattered (S, N) rows before their sum over the top-k slots are the layer's largest transient (in forward and in
# the input gradient; Qwen3-30B-A3B at 8K tokens: 65,536 rows x 2,048 bf16 = 256 MiB): made a block of columns at
# a time they take at most this much. The GEMM work is the same (every output tile reads its row and column panels
# either way); a few more launches.
SUM_BLOCK_BYTES = 64 * 2**20
_SUM_BLOCK_ALIGN = 16  # columns per block a multiple of 16: 32-byte aligned slices for torch._grouped_mm


def _gmm_summed_over_slots(
    ops: GroupedOps,
    x: torch.Tensor,
    w: torch.Tensor,
    routing: Routing,
    *,
    lora=None,
    bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """(T, N) in x's dtype: for each token, the sum over its top-k slots of `ops.gmm(x, w, scatter=True, ...)`,
    computed `SUM_BLOCK_BYTES` of scattered rows at a time (see above). x: (S, K) sorted rows; w: (E, K, N)."""
    n_cols = w.shape[2]
    row_bytes = routing.num_rows * x.element_size()
    block = max(_SUM_BLOCK_ALIGN, SUM_BLOCK_BYTES // max(row_bytes, 1) // _SUM_BLOCK_ALIGN * _SUM_BLOCK_ALIGN)
    if block >= n_cols:
        rows = ops.gmm(x, w, routing, lora=lora, bias=bias, row_scale=row_scale, scatter=True)
        return rows.view(routing.num_tokens, routing.top_k, n_cols).sum(1)
    out = torch.empty(routing.num_tokens, n_cols, device=x.device, dtype=x.dtype)
    for c0 in range(0, n_cols, block):
        cols = slice(c0, min(c0 + block, n_cols))
        part_lora = (lora[0], lora[1][:, :, cols], lora[2]) if lora is not None else None
        rows = ops.gmm(
            x,
            w[:, :, cols],
            routing,
            lora=part_lora,
            bias=bias[:, cols] if bias is not None else None,
            row_scale=row_scale,
            scatter=True,
        )
        torch.sum(rows.view(routing.num_tokens, routing.top_k, -1), dim=1, out=out[:, cols])
        del rows
    return out


def _scatter_rows(rows: torch.Tensor, routing: Routing) -> torch.Tensor:
    return torch.empty_like(rows).index_copy_(0, routing.perm, rows)


class MoeExpertsFunction(torch.autograd.Function):
    """Autograd over the grouped GEMMs of one experts layer.

    For T tokens routed to top_k of E experts (S = T * top_k sorted rows, see `hone.kernels.moe.routing.route`):

        gate_up = x[token] @ W_up[e] + s_up * (drop(x[token]) @ A_up[e]) @ B_up[e] + b_up[e]      (S, N1)
        h       = activation(gate_up)                                                          (S, I)
        y       = h @ W_down[e] + s_down * (drop(h) @ A_down[e]) @ B_down[e] + b_down[e]       (S, H)
        out[t]  = sum over k of routing_weight[t, k] * y[row of (t, k)]                        (T, H)

    Saved for backward are the layer input x (T, H) (not its top_k copies), gate_up and the two rank-r LoRA
    activations; h is recomputed from gate_up (for a fused gate, Qwen's silu halves or gpt-oss's clamped GLU, in one
    pass that also gives the gradients towards gate_up and the routing weights, see `hone.kernels.moe.glu` and
    `hone.kernels.moe.clamped_glu`). Gradients flow to x, the routing weights,
    the LoRA factors and, when they require it, the base weights and biases. Dropout masks are regenerated from a
    seed in backward rather than stored. The arguments are `moe_experts`'s, unpacked; `plan` holds the rest.
    """

    @staticmethod
    def forward(
        ctx, hidden, top_k_weights, w_up, b_up, w_down, b_down, a_up, b_up_lora, a_down, b_down_lora, plan: _Plan
    ):
        r, ops = plan.routing, plan.ops
        dtype = w_up.dtype
        x = hidden.to(dtype)
        row_weight = top_k_weights.reshape(-1)[r.perm]
        a1, a2 = _cast(a_up, dtype), _cast(a_down, dtype)
        b1, b2 = _cast(b_up_lora, dtype, dense=True), _cast(b_down_lora, dtype, dense=True)

        xs, x_gather = _sorted_source(x, r, ops)
        xa = lora_up = None
        if a1 is not None:
            if plan.up_dropout:
                xa = ops.gmm(_dropped(x[r.token], plan.up_dropout, plan.up_seed), a1, r)
            else:
                xa = ops.gmm(xs, a1, r, gather=x_gather)
            lora_up = (xa, b1, plan.up_scale)
        gate_up = ops.gmm(xs, w_up, r, gather=x_gather, lora=lora_up, bias=b_up)
        del xs
        h = _activation(plan, gate_up)

        ha = lora_down = None
        if a2 is not None:
            hd = _dropped(h, plan.down_dropout, plan.down_seed) if plan.down_dropout else h
            ha = ops.gmm(hd, a2, r)
            lora_down = (ha, b2, plan.down_scale)
        out = _gmm_summed_over_slots(ops, h, w_down, r, lora=lora_down, bias=b_down, row_scale=row_weight)

        ctx.plan = plan
        ctx.dtypes = tuple(t.dtype if t is not None else None for t in (a_up, b_up_lora, a_down, b_down_lora))
        ctx.weights_dtype = top_k_weights.dtype
        ctx.save_for_backward(hidden, row_weight, gate_up, xa, ha, w_up, w_down, b_down, a1, b1, a2, b2)
        return out.to(hidden.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        hidden, row_weight, gate_up, xa, ha, w_up, w_down, b_down, a1, b1, a2, b2 = ctx.saved_tensors
        plan: _Plan = ctx.plan
        r, ops = plan.routing, plan.ops
        need = ctx.needs_input_grad
        dtype = w_up.dtype
        d_out = d_out.to(dtype).contiguous()
        x = hidden.to(dtype)
        w_col = row_weight[:, None]
        grads: list[torch.Tensor | None] = [None] * 11

        fused_activation = (plan.silu_halves or plan.clamped_glu is not None) and not plan.down_dropout
        if not fused_activation:
            with torch.enable_grad():
                gate_up_leaf = gate_up.detach().requires_grad_(True)
                h_graph = plan.activation(gate_up_leaf)
            h = h_graph.detach()

        # ---- down projection: y = h @ W_down + s (drop(h) @ A) @ B + b; out = sum_k w * y
        ds, d_gather = _sorted_source(d_out, r, ops)
        u = None  # s * d_out[token] @ B^T: the gradient of (drop(h) @ A) divided by the routing weight
        if a2 is not None:
            u = ops.gmm(ds, b2.transpose(1, 2), r, gather=d_gather)
            u.mul_(plan.down_scale)
        fuse_down = a2 is not None and not plan.down_dropout
        g = ops.gmm(
            ds, w_down.transpose(1, 2), r, gather=d_gather, lora=(u, a2.transpose(1, 2), 1.0) if fuse_down else None
        )  # d y / d h, per unit routing weight
        row_dots = None
        if fused_activation:
            # h again, d gate_up (over the saved gate_up when this graph runs backward only once) and the row dots
            h, d_gate_up, row_dots = _activation_grad(plan, gate_up, g, row_weight)
            del gate_up
        if need[1]:
            grads[1] = _routing_weight_grad(ctx, g, h, row_dots, u, ha, d_out, b_down)
        if not fused_activation:
            if a2 is not None and plan.down_dropout:
                lora_g = ops.gmm(u, a2.transpose(1, 2), r)
                g = g + _dropped(lora_g, plan.down_dropout, plan.down_seed)
            d_h = g * w_col.to(dtype)
            d_gate_up = torch.autograd.grad(h_graph, gate_up_leaf, d_h)[0]
            del d_h, h_graph, gate_up_leaf
        del g
        _down_weight_grads(ctx, grads, h, u, ha, ds, d_gather, w_col, dtype, w_down, b_down, a2)
        del h, u, ds

        # ---- up projection: gate_up = x[token] @ W_up + s (drop(x[token]) @ A) @ B + b
        _up_grads(ctx, grads, d_gate_up, x, hidden, xa, w_up, a1, b1)
        return tuple(grads)


def _activation(plan: _Plan, gate_up: torch.Tensor) -> torch.Tensor:
    """h = activation(gate_up): a fused gate where the layer has one, else the module's own (autograd-free here)."""
    if plan.silu_halves:
        return swiglu_halves(gate_up)
    if plan.clamped_glu is not None:
        return clamped_glu(gate_up, plan.clamped_glu)
    return plan.activation(gate_up)


def _activation_grad(plan: _Plan, gate_up, g, row_weight):
    """(h, d gate_up, <g, h> per row) from a fused gate, over the saved gate_up when the graph runs backward once."""
    if plan.silu_halves:
        return swiglu_halves_grad(gate_up, g, row_weight, overwrite=plan.single_use)
    return clamped_glu_grad(gate_up, g, row_weight, plan.clamped_glu, overwrite=plan.single_use)


def _routing_weight_grad(ctx, g, h, row_dots, u, ha, d_out, b_down) -> torch.Tensor:
    """(T, K) d out / d routing weight = <d_out[token], y>; expanding y keeps us from storing it:
    <g, h> (+ <u, drop(h) A>) + bias. `row_dots`: <g, h> per row when the fused activation gave it, else None;
    `u`: None without LoRA on the down projection."""
    plan: _Plan = ctx.plan
    r = plan.routing
    d_row_weight = row_dots if row_dots is not None else (_wide(g) * _wide(h)).sum(-1)
    if u is not None and plan.down_dropout:
        d_row_weight += (_wide(u) * _wide(ha)).sum(-1)
    if b_down is not None:
        d_row_weight += (_wide(d_out) @ _wide(b_down).T)[r.token, r.expert.long()]
    d_flat = torch.empty_like(d_row_weight).index_copy_(0, r.perm, d_row_weight)
    return d_flat.view(r.num_tokens, r.top_k).to(ctx.weights_dtype)


def _down_weight_grads(ctx, grads, h, u, ha, ds, d_gather, w_col, dtype, w_down, b_down, a2) -> None:
    """Into `grads`: the down projection's LoRA factors (8, 9), weight (4) and bias (5), where they are needed."""
    plan: _Plan = ctx.plan
    r, ops = plan.routing, plan.ops
    need = ctx.needs_input_grad
    dtype = w_down.dtype
    if a2 is not None:
        hd = _dropped(h, plan.down_dropout, plan.down_seed) if plan.down_dropout else h
        if need[8]:
            grads[8] = ops.wgrad(hd, u * w_col.to(dtype), r).to(ctx.dtypes[2])
        if need[9]:
            d_b = ops.wgrad(ha * w_col.to(dtype), ds, r, gather_q=d_gather)
            grads[9] = (d_b * plan.down_scale).to(ctx.dtypes[3])
    if need[4]:
        grads[4] = ops.wgrad(h * w_col.to(dtype), ds, r, gather_q=d_gather).to(w_down.dtype)
    if need[5]:
        rows = _wide(ds[r.token] if d_gather else ds) * w_col
        summed = rows.new_zeros(r.num_experts, rows.shape[1]).index_add_(0, r.expert.long(), rows)
        grads[5] = summed.to(b_down.dtype)


def _up_grads(ctx, grads, d_gate_up, x, hidden, xa, w_up, a1, b1) -> None:
    """Into `grads`: the layer input's (0), the up projection's weight (2), bias (3) and LoRA factors (6, 7)."""
    plan: _Plan = ctx.plan
    r, ops = plan.routing, plan.ops
    need = ctx.needs_input_grad
    v = None  # s * d_gate_up @ B^T: the gradient of drop(x[token]) @ A
    if a1 is not None:
        v = ops.gmm(d_gate_up, b1.transpose(1, 2), r)
        v.mul_(plan.up_scale)
    if need[0]:
        grads[0] = _input_grad(plan, d_gate_up, v, w_up, a1, hidden.dtype)
    reads_x = need[2] or (a1 is not None and need[6] and not plan.up_dropout)
    xs, x_gather = _sorted_source(x, r, ops) if reads_x else (None, False)
    if a1 is not None:
        if need[6]:
            if plan.up_dropout:
                grads[6] = ops.wgrad(_dropped(x[r.token], plan.up_dropout, plan.up_seed), v, r)
            else:
                grads[6] = ops.wgrad(xs, v, r, gather_p=x_gather)
            grads[6] = grads[6].to(ctx.dtypes[0])
        if need[7]:
            grads[7] = (ops.wgrad(xa, d_gate_up, r) * plan.up_scale).to(ctx.dtypes[1])
    if need[2]:
        grads[2] = ops.wgrad(xs, d_gate_up, r, gather_p=x_gather).to(w_up.dtype)
    if need[3]:
        rows = _wide(d_gate_up)
        grads[3] = rows.new_zeros(r.num_experts, rows.shape[1]).index_add_(0, r.expert.long(), rows).to(w_up.dtype)


def _input_grad(plan: _Plan, d_gate_up, v, w_up, a1, out_dtype: torch.dtype) -> torch.Tensor:
    """(T, H) in `out_dtype`: the layer input's gradient, summed over each token's top-k rows."""
    r, ops = plan.routing, plan.ops
    if a1 is not None and plan.up_dropout:
        dx = ops.gmm(d_gate_up, w_up.transpose(1, 2), r)
        dx += _dropped(ops.gmm(v, a1.transpose(1, 2), r), plan.up_dropout, plan.up_seed)
        dx = _scatter_rows(dx, r)
        return dx.view(r.num_tokens, r.top_k, -1).sum(1).to(out_dtype)
    return _gmm_summed_over_slots(
        ops,
        d_gate_up,
        w_up.transpose(1, 2),
        r,
        lora=(v, a1.transpose(1, 2), 1.0) if a1 is not None else None,
    ).to(out_dtype)


def _pad_rank(lora: LoraFactors, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad the rank to a multiple (zero columns of A and rows of B add nothing; their gradients are dropped)."""
    rank = lora.a.shape[-1]
    extra = -rank % multiple
    if not extra:
        return lora.a, lora.b
    return F.pad(lora.a, (0, extra)), F.pad(lora.b, (0, 0, 0, extra))


def moe_experts(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    weights: ExpertWeights,
    ops: GroupedOps,
    *,
    lora_up: LoraFactors | None = None,
    lora_down: LoraFactors | None = None,
    training: bool = False,
    routing: Routing | None = None,
    single_use: bool = False,
) -> torch.Tensor:
    """The experts layer (formulas in `MoeExpertsFunction`) on one backend.

    Args:
        hidden: (T, H) layer input.
        top_k_index: (T, K) expert ids. top_k_weights: (T, K) routing weights.
        weights: the layer's expert weights.
        ops: the grouped-GEMM backend (`hone.kernels.moe.backends.make_ops`).
        lora_up, lora_down: LoRA factors on the up (gate_up) and down projections, or None.
        training: apply LoRA dropout.
        routing: a precomputed `route(top_k_index, E)` (computed here when None).
        single_use: the autograd graph will be back-propagated exactly once (a checkpointed layer's recompute), so
            backward may overwrite saved activations it no longer needs (saves (S, 2I) of memory).

    Returns:
        (T, H) in hidden's dtype.
    """
    num_experts = weights.up.shape[0]
    routing = routing if routing is not None else route(top_k_index, num_experts)
    factors = []
    for lora in (lora_up, lora_down):
        factors.extend(_pad_rank(lora, ops.rank_multiple) if lora is not None else (None, None))

    def dropout(lora: LoraFactors | None) -> float:
        return lora.dropout if lora is not None and training else 0.0

    # Dropout seeds come from torch's CPU generator (no device sync), so they follow torch.manual_seed and
    # activation checkpointing's saved RNG state replays them.
    seeds = torch.randint(0, 2**62, (2,)).tolist() if dropout(lora_up) or dropout(lora_down) else [0, 0]
    plan = _Plan(
        routing=routing,
        ops=ops,
        activation=weights.activation,
        silu_halves=weights.silu_halves,
        clamped_glu=weights.clamped_glu,
        single_use=single_use,
        up_scale=lora_up.scale if lora_up else 0.0,
        down_scale=lora_down.scale if lora_down else 0.0,
        up_dropout=dropout(lora_up),
        down_dropout=dropout(lora_down),
        up_seed=seeds[0],
        down_seed=seeds[1],
    )
    return MoeExpertsFunction.apply(
        hidden, top_k_weights, weights.up, weights.up_bias, weights.down, weights.down_bias, *factors, plan
    )


def moe_experts_reference(
    hidden: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    weights: ExpertWeights,
    *,
    lora_up: LoraFactors | None = None,
    lora_down: LoraFactors | None = None,
) -> torch.Tensor:
    """The same layer expert by expert with W + scale * A @ B formed, plain autograd, no dropout (for tests)."""
    out = torch.zeros_like(hidden)
    for e in range(weights.up.shape[0]):
        token, slot = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        w_up, w_down = weights.up[e], weights.down[e]
        if lora_up is not None:
            w_up = w_up + lora_up.scale * (lora_up.a[e] @ lora_up.b[e]).to(w_up.dtype)
        if lora_down is not None:
            w_down = w_down + lora_down.scale * (lora_down.a[e] @ lora_down.b[e]).to(w_down.dtype)
        y = hidden[token] @ w_up
        if weights.up_bias is not None:
            y = y + weights.up_bias[e]
        y = weights.activation(y) @ w_down
        if weights.down_bias is not None:
            y = y + weights.down_bias[e]
        out = out.index_add(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
    return out

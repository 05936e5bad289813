"""Packed attention back-propagated a group of whole sequences at a time, so its backward workspace exists per group.

Beyond dq/dk/dv, a flash-attention backward over a packed batch allocates a float32 dq accumulator and, for
grouped-query models, dk and dv expanded to every query head: (4 + 2 + 2) bytes x tokens x query heads x head dim.
Attention never crosses a sequence boundary, so the backward can run one group after the other. The one thing to
know: the price is one more attention forward per layer (`GroupedBackwardAttention` keeps only q, k and v); what it
saves and costs is on docs/performance/memory.md. `speed.grouped_attention_backward` turns it on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hone.core.speed.checkpointing.layer_groups import groups_for

# Backward workspace per group (dq accumulator + expanded dk/dv): 2**27 bytes = 128 MiB.
WORKSPACE_BYTES = 2**27
# Fewer tokens than this per group make the attention kernels too short to fill a large GPU.
MIN_GROUP_TOKENS = 2048

Attend = Callable[..., torch.Tensor]  # attend(q, k, v, cu_seqlens, max_len) -> out, varlen layout (T, H, D)


def group_tokens(query_heads: int, head_dim: int) -> int:
    """Tokens per group whose backward workspace stays near `WORKSPACE_BYTES`."""
    per_token = query_heads * head_dim * (4 + 2 + 2)
    return max(MIN_GROUP_TOKENS, WORKSPACE_BYTES // max(per_token, 1))


class GroupedBackwardAttention(torch.autograd.Function):
    """Packed attention whose backward runs a group of whole sequences at a time.

    Forward runs the attention without autograd and keeps only q, k and v (not the output or the log-sum-exp).
    Backward recomputes each group's attention forward with autograd (`attend` on the group's slices, with the
    group's own offsets from `hone.core.speed.checkpointing.layer_groups`) and back-propagates the group's slice of
    the output gradient, so one group's workspace exists at a time. The price is one more attention forward per
    layer and a few more kernel launches; the layer's other launches are unchanged.

    Args (forward): q (T, Hq, D), k and v (T, Hkv, D) in varlen layout; attend; cu_seqlens and max_len of the whole
    batch; groups: the `SequenceGroup`s the backward runs.
    """

    @staticmethod
    def forward(ctx, q, k, v, attend, cu_seqlens, max_len, groups):
        ctx.save_for_backward(q, k, v)
        ctx.attend, ctx.groups = attend, groups
        return attend(q, k, v, cu_seqlens, max_len)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for group in ctx.groups:
            span = slice(group.start, group.end)
            pieces = [t[span].detach().requires_grad_(True) for t in (q, k, v)]
            with torch.enable_grad():
                out = ctx.attend(*pieces, group.cu_seqlens, group.max_len)
            grads = torch.autograd.grad(out, pieces, grad_out[span])
            for target, grad in zip((dq, dk, dv), grads, strict=True):
                target[span] = grad
            del out, pieces, grads  # this group's workspace goes before the next group's exists
        ctx.attend = ctx.groups = None
        return dq, dk, dv, None, None, None, None


def backward_groups(q: torch.Tensor, cu_seqlens: torch.Tensor) -> list | None:
    """The sequence groups for this call's backward, or None when it should run whole (no autograd, a batch that
    was not registered, or one group would hold everything). Frozen attention projections without LoRA leave q
    without gradient while k or v may have one: q is the widest, so it decides."""
    if not torch.is_grad_enabled() or not q.requires_grad:
        return None
    tokens = group_tokens(q.shape[1], q.shape[2])
    if q.shape[0] <= tokens:
        return None
    groups = groups_for(cu_seqlens, tokens)
    if groups is None or len(groups) < 2 or groups[-1].end != q.shape[0]:
        return None
    return groups


def attention(q, k, v, cu_seqlens: torch.Tensor, max_len: int, attend: Attend) -> torch.Tensor:
    """`attend(q, k, v, cu_seqlens, max_len)`, back-propagated in sequence groups where that applies."""
    groups = backward_groups(q, cu_seqlens)
    if groups is None:
        return attend(q, k, v, cu_seqlens, max_len)
    return GroupedBackwardAttention.apply(q, k, v, attend, cu_seqlens, max_len, groups)

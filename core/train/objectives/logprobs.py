"""Per-sequence log-probabilities of a batch's trained tokens, without ever holding all logits.

What preference methods compare: log p(completion | prompt) = the sum of the completion tokens' log-probabilities,
for every sequence of a packed (or padded) batch. The chunked path runs the model's body once, takes the hidden
states of the trained positions only, and projects them through the LM head a chunk of tokens at a time; each chunk
is recomputed in backward (activation checkpointing of the head), so a step holds one chunk of logits at a time in
either direction. `plain` (the model's own forward, full logits) is the reference it must match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hone.core.models.head import HeadPlan, head_plan
from hone.core.speed.host_tables import HostLMHead
from hone.core.train.loss import auto_chunk_tokens, hidden_states, is_linear_head, postprocess_logits


def _chunk_logprobs(h: torch.Tensor, targets: torch.Tensor, project, scale: float, softcap) -> torch.Tensor:
    """(c,) fp32 log-probabilities of `targets` under the logits `project(h)` (post-processed as the model does)."""
    logits = postprocess_logits(project(h), scale, softcap).float()
    return -F.cross_entropy(logits, targets, reduction="none")


def _projection(head, device: torch.device):
    """The head as a function of hidden states: a plain linear head (or one kept in host memory, copied over once
    per call) through F.linear, anything else (peft-wrapped, quantized) as the module."""
    if isinstance(head, HostLMHead):
        weight = head.device_weight(device)
        return lambda h: F.linear(h, weight, head.bias)
    if is_linear_head(head) and head.weight.dtype.is_floating_point:
        return lambda h: F.linear(h, head.weight, head.bias)
    return head


def chunked_token_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, plan: HeadPlan, chunk_tokens: int | None = None
) -> torch.Tensor:
    """(N,) fp32 log-probabilities of `targets` ((N,) int64, all valid) given `hidden` ((N, H)), one chunk of tokens
    through the head at a time. Under autograd each chunk is checkpointed: its logits are freed after its forward and
    computed again in its backward."""
    head = plan.head
    if chunk_tokens is None:
        vocab = getattr(head, "out_features", None) or head.weight.shape[0]
        chunk_tokens = auto_chunk_tokens(vocab)
    project = _projection(head, hidden.device)
    pieces = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logprobs, h, t, project, plan.scale, plan.softcap, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(h, t, project, plan.scale, plan.softcap))
    return torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)


def sequence_index(batch, positions: torch.Tensor) -> torch.Tensor:
    """The sequence each flat position of `batch` belongs to, on the positions' device (no host sync): packed
    batches from their offsets, padded ones from the row width."""
    cu = getattr(batch, "cu_seqlens", None)
    if cu is not None:
        return torch.searchsorted(cu[1:].to(positions.dtype), positions, right=True)
    return torch.div(positions, batch.input_ids.shape[1], rounding_mode="floor")


def sequence_logprobs(model, batch, *, mode: str = "chunked") -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence of `batch` (on the model's device): the summed log-probability of its trained tokens and their
    count, both (S,) fp32 for the batch's S sequences, in the batch's order. Differentiable when grad is on.

    Args:
        model: a transformers causal LM, or a peft model around one.
        batch: a `PackedBatch` or `PaddedBatch` with `trained_positions`.
        mode: "chunked" (falls back to plain for a model it cannot split into body and head) or "plain".
    """
    positions = batch.trained_positions
    count = len(batch.seq_lens)
    plan = head_plan(model) if mode == "chunked" else None
    targets = batch.targets.flatten().index_select(0, positions)
    if isinstance(plan, HeadPlan):
        hidden = hidden_states(plan.body, batch.model_inputs()).flatten(0, 1).index_select(0, positions)
        token_logprobs = chunked_token_logprobs(hidden, targets, plan)
    else:
        logits = model(**batch.model_inputs()).logits.flatten(0, 1).index_select(0, positions)
        token_logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None]).squeeze(1)
    seq = sequence_index(batch, positions)
    sums = torch.zeros(count, dtype=torch.float32, device=positions.device).index_add(0, seq, token_logprobs)
    ones = torch.ones_like(token_logprobs, dtype=torch.float32).detach()
    counts = torch.zeros(count, dtype=torch.float32, device=positions.device).index_add(0, seq, ones)
    return sums, counts

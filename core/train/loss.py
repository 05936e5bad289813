"""Cross-entropy over the LM head without ever holding the full [tokens x vocabulary] logits.

`loss_sum(model, batch)` returns the fp32 SUM of next-token cross-entropy over the batch's trained positions; the
trainer divides by the step's trained-token count, which the batches know on the CPU, so micro-batches are
token-weighted and nothing waits for the GPU. The `chunked` mode computes each chunk's loss and gradients at once
and frees its logits; `plain` (the model's own forward) is the reference it must match.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from hone.core.data.collate import IGNORE_INDEX
from hone.core.models.head import HeadPlan, head_plan
from hone.core.speed.host_tables import HostLMHead

LOSS_MODES = ("chunked", "plain")

# Logits one chunk may hold: 2**26 fp32 values = 256 MiB (441 tokens of a 151,936-token vocabulary). With the
# chunk's bf16 logits and bf16 gradient the loss then needs ~0.5 GiB of transient memory, less than one decoder
# layer's backward, while each chunk's head GEMM (441 x 151,936 x H) is still large enough to run at full speed.
# A 4x larger chunk (2**28) set the Qwen3-0.6B step's memory peak (docs/performance/dense.md#the-loss).
CHUNK_LOGIT_ELEMENTS = 2**26
# The fused cross-entropy kernel keeps only the chunk's logits (overwritten by their gradient): 2**27 bf16 values
# are 256 MiB, the torch path's budget, in half as many chunks.
FUSED_CHUNK_LOGIT_ELEMENTS = 2**27
# Bounds on the automatic chunk: below 256 tokens the head matmuls get too small to keep a GPU busy; above 16K
# the per-chunk bookkeeping no longer matters.
MIN_CHUNK_TOKENS = 256
MAX_CHUNK_TOKENS = 16384


def fused_cross_entropy_runs(*tensors: torch.Tensor) -> bool:
    """Whether the fused cross-entropy kernel runs on these tensors (Triton installed, a device it runs on)."""
    try:
        from hone.kernels.cross_entropy import fused_cross_entropy_runs as runs
    except ImportError:  # no Triton on this platform
        return False
    return runs(*tensors)


def auto_chunk_tokens(vocab_size: int, fused: bool = False) -> int:
    """Tokens per chunk so one chunk's logits stay near `CHUNK_LOGIT_ELEMENTS` (`FUSED_CHUNK_LOGIT_ELEMENTS` on
    the fused kernel's path)."""
    budget = FUSED_CHUNK_LOGIT_ELEMENTS if fused else CHUNK_LOGIT_ELEMENTS
    return max(MIN_CHUNK_TOKENS, min(MAX_CHUNK_TOKENS, budget // max(vocab_size, 1)))


def is_linear_head(head: nn.Module) -> bool:
    """A head the manual-gradient path computes: a plain `nn.Linear`, or one whose weight is kept in host memory."""
    return type(head) is nn.Linear or isinstance(head, HostLMHead)


def postprocess_logits(logits: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """The logit post-processing transformers models apply after the head: a scale, then a tanh soft-cap."""
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits


def _linear_chunk(
    h: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    fused: bool = False,
):
    """Loss of one chunk through a plain linear head, and the gradient of that loss towards the logits.

    Args:
        h: (c, H) hidden states in the model dtype.
        targets: (c,) int64, -100 where no loss is taken.
        weight: (V, H) head weight; bias: (V,) or None.
        fused: use the fused cross-entropy kernel where it runs.

    Returns:
        (loss: fp32 scalar, grad_logits: (c, V) in the weight dtype).
    """
    logits = F.linear(h, weight, bias)
    if fused and fused_cross_entropy_runs(logits, targets):
        from hone.kernels.cross_entropy import cross_entropy_grad_

        return cross_entropy_grad_(logits, targets, scale, softcap, IGNORE_INDEX).sum(), logits
    logits = logits.float()
    if scale != 1.0:
        logits.mul_(scale)
    tanh = None
    if softcap is not None:
        tanh = logits.div_(softcap).tanh_()
        logits = tanh * softcap
    valid = targets != IGNORE_INDEX
    safe = targets.clamp(min=0).unsqueeze(1)
    target_logit = logits.gather(1, safe).squeeze(1)
    # log-sum-exp in place: torch.logsumexp would allocate a second (c, V) fp32 buffer for exp(logits - max).
    row_max = logits.amax(dim=1, keepdim=True)
    probs = logits.sub_(row_max).exp_()
    sums = probs.sum(dim=1)
    lse = sums.log() + row_max.squeeze(1)
    loss = ((lse - target_logit) * valid).sum()
    probs.div_(sums.unsqueeze(1))
    probs.scatter_add_(1, safe, -valid.to(probs.dtype).unsqueeze(1))
    probs.mul_(valid.unsqueeze(1))
    if tanh is not None:
        probs.mul_(1.0 - tanh * tanh)
    if scale != 1.0:
        probs.mul_(scale)
    return loss, probs.to(weight.dtype)


def _autocast_off(device_type: str):
    """Autocast switched off, where the device has autocast at all (the meta device of memory plans has none)."""
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def _loss_only(hidden, targets, project, scale, softcap, chunk) -> torch.Tensor:
    """Chunked loss without gradients (evaluation); `project` maps hidden states to logits."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = postprocess_logits(project(hidden[start : start + chunk]), scale, softcap).float()
        total += F.cross_entropy(logits, targets[start : start + chunk], ignore_index=IGNORE_INDEX, reduction="sum")
    return total


class _LinearHeadLoss(torch.autograd.Function):
    """Chunked cross-entropy through a plain `nn.Linear` head with manual gradients (the leanest path).

    The matmuls run in `compute_dtype` (the autocast dtype when the caller is under autocast, else the weight's
    dtype) with autocast switched off inside, so the dtypes are explicit.
    """

    @staticmethod
    def forward(ctx, hidden, targets, weight, bias, scale, softcap, chunk, compute_dtype, fused):
        want_h, want_w = hidden.requires_grad, weight.requires_grad
        want_b = bias is not None and bias.requires_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if want_b else None
        with _autocast_off(hidden.device.type):
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start : start + chunk].to(compute_dtype)
                loss, grad_logits = _linear_chunk(h, targets[start : start + chunk], w, b, scale, softcap, fused)
                total += loss
                if want_h:
                    grad_h[start : start + chunk] = grad_logits @ w
                if want_w:
                    grad_w += grad_logits.t() @ h
                if want_b:
                    grad_b += grad_logits.sum(0, dtype=torch.float32)
                del grad_logits  # free this chunk's gradient before the next chunk's logits exist
        ctx.save_for_backward(*(t for t in (grad_h, grad_w, grad_b) if t is not None))
        ctx.wants = (want_h, want_w, want_b)
        ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        want_h, want_w, want_b = ctx.wants
        grad_h = None
        if want_h:
            grad_h = saved.pop(0)
            grad_h = grad_h * grad_out.to(grad_h.dtype)
        grad_w = (saved.pop(0) * grad_out).to(ctx.dtypes[0]) if want_w else None
        grad_b = (saved.pop(0) * grad_out).to(ctx.dtypes[1]) if want_b else None
        return grad_h, None, grad_w, grad_b, None, None, None, None, None


def _module_chunk(hidden, targets, head, scale, softcap, want_h: bool, params: tuple) -> tuple[torch.Tensor, list]:
    """Loss of one chunk through any head module and its gradients by local autograd: (fp32 loss, [grad of the
    hidden chunk if wanted, grads of params (None where unused)]). Its logits die when it returns."""
    h = hidden.detach().requires_grad_(want_h)
    with torch.enable_grad():
        logits = postprocess_logits(head(h), scale, softcap).float()
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        inputs = ([h] if want_h else []) + list(params)
        grads = list(torch.autograd.grad(loss, inputs, allow_unused=True)) if inputs else []
    return loss.detach(), grads


class _ModuleHeadLoss(torch.autograd.Function):
    """Chunked cross-entropy through any head module (peft-wrapped, quantized ...), gradients by local autograd.

    The head's trainable parameters are passed as inputs so their gradients flow out of `backward`.
    """

    @staticmethod
    def forward(ctx, hidden, targets, head, scale, softcap, chunk, *params):
        want_h = hidden.requires_grad
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_p = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        for start in range(0, hidden.shape[0], chunk):
            loss, grads = _module_chunk(
                hidden[start : start + chunk], targets[start : start + chunk], head, scale, softcap, want_h, params
            )
            total += loss
            if want_h:
                grad_h[start : start + chunk] = grads.pop(0)
            for acc, g in zip(grad_p, grads, strict=True):
                if g is not None:
                    acc += g
            del grads  # this chunk's gradients go before the next chunk's logits exist
        ctx.save_for_backward(*(([grad_h] if grad_h is not None else []) + grad_p))
        ctx.has_h = grad_h is not None
        ctx.dtypes = [p.dtype for p in params]
        return total

    @staticmethod
    def backward(ctx, grad_out):
        saved = list(ctx.saved_tensors)
        grad_h = None
        if ctx.has_h:
            grad_h = saved.pop(0)
            grad_h = grad_h * grad_out.to(grad_h.dtype)
        grad_p = [(g * grad_out).to(dtype) for g, dtype in zip(saved, ctx.dtypes, strict=True)]
        return (grad_h, None, None, None, None, None, *grad_p)


def chunked_head_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: nn.Module,
    *,
    scale: float = 1.0,
    softcap: float | None = None,
    chunk_tokens: int | None = None,
    fused: bool = True,
) -> torch.Tensor:
    """SUM of cross-entropy of `head(hidden)` against `targets`, one chunk of tokens at a time.

    Each chunk's loss *and* its gradients (towards the hidden states and any trainable head weights) are computed
    right away and the chunk's logits are freed, so peak memory holds one chunk of logits instead of all of them;
    the backward pass only scales the stored gradients by the incoming factor. With `fused`, a plain linear head's
    chunk loss and logit gradient come from one Triton kernel that overwrites the chunk's logits with their
    gradient (`hone.kernels.cross_entropy`), where it runs; else from torch ops on a float32 copy.

    Args:
        hidden: (N, H) hidden states (any float dtype).
        targets: (N,) int64 class ids, -100 = ignored.
        head: the output projection; a plain `nn.Linear` (or a `HostLMHead`, its weight copied to the device once
            per call) takes the manual-gradient path, anything else (peft
            LoRA-wrapped, quantized) local autograd per chunk.
        scale, softcap: logit post-processing, as in `hone.core.models.head.HeadPlan`.
        chunk_tokens: tokens per chunk; None picks one from the vocabulary size.
        fused: a plain linear head's chunks go through the fused cross-entropy kernel where it runs.

    Returns:
        fp32 scalar; differentiable towards `hidden` and the head's trainable parameters.
    """
    linear = is_linear_head(head) and head.weight.dtype.is_floating_point
    if chunk_tokens is None:
        vocab = getattr(head, "out_features", None) or head.weight.shape[0]
        chunk_tokens = auto_chunk_tokens(vocab, fused=fused and linear and fused_cross_entropy_runs(hidden, targets))
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    # A head kept in host memory comes to the device once here, for every chunk, and goes when the loss is done.
    weight = head.device_weight(hidden.device) if isinstance(head, HostLMHead) else head.weight if linear else None
    if not torch.is_grad_enabled():
        project = head if weight is None else lambda h: F.linear(h, weight, head.bias)
        return _loss_only(hidden, targets, project, scale, softcap, chunk_tokens)
    if linear:
        device_type = hidden.device.type
        autocast = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
        compute_dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
        return _LinearHeadLoss.apply(
            hidden, targets, weight, head.bias, scale, softcap, chunk_tokens, compute_dtype, fused
        )
    params = [p for p in head.parameters() if p.requires_grad]
    return _ModuleHeadLoss.apply(hidden, targets, head, scale, softcap, chunk_tokens, *params)


def plain_loss_sum(model, batch) -> torch.Tensor:
    """The reference: the model's own forward with full logits, then fp32 cross-entropy summed."""
    logits = model(**batch.model_inputs()).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def hidden_states(body: nn.Module, inputs: dict) -> torch.Tensor:
    """The (B, T, H) hidden states a model body gives for `inputs`."""
    out = body(**inputs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def loss_sum(
    model, batch, *, mode: str = "chunked", chunk_tokens: int | None = None, fused: bool = True
) -> torch.Tensor:
    """SUM of next-token cross-entropy over the batch's trained positions, as an fp32 scalar.

    Trained positions are those with `batch.targets != -100`; the collator has already shifted the targets, so no
    shift happens here. Two modes:

    - `plain`: the model's own forward (full logits), then cross-entropy. The reference.
    - `chunked`: the model body gives hidden states; only the trained positions go through the LM head, a chunk
      of tokens at a time (`chunked_head_loss`). It reproduces the logit post-processing transformers models
      apply after the head (a multiplier, a divisor, a tanh soft-cap); a model with any other logit setting it
      does not know falls back to `plain`.

    Args:
        model: a transformers causal LM, or a peft model around one.
        batch: a `PackedBatch` or `PaddedBatch` already on the model's device.
        mode: "chunked" (no full logits; falls back to plain for a model it cannot split) or "plain".
        chunk_tokens: tokens per head chunk in chunked mode; None picks it from the vocabulary size.
        fused: chunked mode uses the fused cross-entropy kernel where it runs (the trainer: `speed.kernels`).

    Returns:
        fp32 scalar. Divide by the step's total `num_trained` for the mean loss.
    """
    if mode not in LOSS_MODES:
        raise ValueError(f"unknown loss mode {mode!r}; choose one of {LOSS_MODES}")
    plan = head_plan(model) if mode == "chunked" else None
    if not isinstance(plan, HeadPlan):
        return plain_loss_sum(model, batch)
    hidden = hidden_states(plan.body, batch.model_inputs())
    hidden = hidden.flatten(0, 1)
    targets = batch.targets.flatten()
    positions = getattr(batch, "trained_positions", None)
    if positions is not None:
        # Only trained positions go through the head: untrained ones (prompts, last tokens) cost nothing.
        hidden = hidden.index_select(0, positions)
        targets = targets.index_select(0, positions)
    return chunked_head_loss(
        hidden, targets, plan.head, scale=plan.scale, softcap=plan.softcap, chunk_tokens=chunk_tokens, fused=fused
    )


def describe(model, mode: str = "chunked", fused: bool = False) -> str:
    """One line for the run log: which loss path this model takes and why (`fused`: the fused kernel is on and
    runs on the model's device)."""
    if mode == "plain":
        return "plain cross-entropy (full logits)"
    plan = head_plan(model)
    if not isinstance(plan, HeadPlan):
        return f"plain cross-entropy: {plan}"
    extra = []
    if plan.scale != 1.0:
        extra.append(f"logit scale {plan.scale:g}")
    if plan.softcap is not None:
        extra.append(f"soft-cap {plan.softcap:g}")
    linear = is_linear_head(plan.head)
    how = ("fused cross-entropy kernel" if fused and linear else "manual gradients") if linear else "per-chunk autograd"
    return "chunked cross-entropy (" + ", ".join([how, *extra]) + ")"


__all__ = [
    "LOSS_MODES",
    "auto_chunk_tokens",
    "chunked_head_loss",
    "describe",
    "fused_cross_entropy_runs",
    "loss_sum",
    "plain_loss_sum",
]

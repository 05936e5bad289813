"""A checkpointed decoder layer as an autograd Function: forward runs the layer without a graph and saves only its
input (through the `Checkpointer`, checkpointer.py); backward recomputes the layer under the forward's RNG and
autocast state and back-propagates through it there, whole or a group of whole sequences at a time. Also the flags
other code reads while a layer runs (`is_recomputing`, `is_checkpointed_forward`, `is_piecewise_forward`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from hone.core.speed.checkpointing.layer_groups import LayerCall
from hone.core.speed.checkpointing.projection_recompute import recomputed_projections

_RECOMPUTING = 0  # > 0 while a layer is being recomputed in backward


def is_recomputing() -> bool:
    """True while a checkpointed layer is recomputed in backward: forward hooks that count work (meters) skip it."""
    return _RECOMPUTING > 0


_FIRST_FORWARD = 0  # > 0 while a checkpointed layer runs its (no-grad) forward, the one its backward recomputes


def is_checkpointed_forward() -> bool:
    """True in the forward of a checkpointed layer: what is computed here is computed again in its backward, unless
    kept (long-row attention keeps its graph, `hone.core.speed.attention.long_rows`)."""
    return _FIRST_FORWARD > 0


@contextlib.contextmanager
def _first_forward():
    global _FIRST_FORWARD
    _FIRST_FORWARD += 1
    try:
        yield
    finally:
        _FIRST_FORWARD -= 1


# > 0 while a checkpointer that back-propagates layers in sequence groups runs a layer's (no-grad) forward
_PIECEWISE_FORWARD = 0


def is_piecewise_forward() -> bool:
    """True in the forward of a checkpointed layer whose backward runs in groups: the fused decoder then runs its
    MLP a piece at a time too, so the forward's transient memory stays as low as the backward's."""
    return _PIECEWISE_FORWARD > 0


@contextlib.contextmanager
def _pieces(enabled: bool):
    global _PIECEWISE_FORWARD
    _PIECEWISE_FORWARD += int(enabled)
    try:
        yield
    finally:
        _PIECEWISE_FORWARD -= int(enabled)


@dataclass
class _ForwardState:
    """RNG and autocast state at a layer's forward, replayed for its recompute (dropout masks, dtypes)."""

    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None
    device: torch.device
    autocast: list[tuple[str, bool, torch.dtype]] = field(default_factory=list)
    autocast_cache: bool = True


def _capture_state(device: torch.device) -> _ForwardState:
    # A step recorded as a CUDA graph (hone.core.speed.step_graphs) may not read the generator's state; it runs
    # only without dropout, where the recompute draws no random numbers to replay.
    cuda = device.type == "cuda"
    kinds = ("cpu", "cuda") if cuda else ("cpu",)
    recording = cuda and torch.cuda.is_current_stream_capturing()
    return _ForwardState(
        cpu_rng=torch.get_rng_state(),
        cuda_rng=torch.cuda.get_rng_state(device) if cuda and not recording else None,
        device=device,
        autocast=[(k, torch.is_autocast_enabled(k), torch.get_autocast_dtype(k)) for k in kinds],
        autocast_cache=torch.is_autocast_cache_enabled(),
    )


@contextlib.contextmanager
def _replayed(state: _ForwardState):
    """Run with the forward's RNG and autocast state; the caller's RNG state is restored afterwards."""
    global _RECOMPUTING
    cpu_before = torch.get_rng_state()
    cuda_before = torch.cuda.get_rng_state(state.device) if state.cuda_rng is not None else None
    torch.set_rng_state(state.cpu_rng)
    if state.cuda_rng is not None:
        torch.cuda.set_rng_state(state.cuda_rng, state.device)
    _RECOMPUTING += 1
    try:
        with contextlib.ExitStack() as stack:
            for kind, enabled, dtype in state.autocast:
                stack.enter_context(
                    torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=state.autocast_cache)
                )
            yield
    finally:
        _RECOMPUTING -= 1
        torch.set_rng_state(cpu_before)
        if cuda_before is not None:
            torch.cuda.set_rng_state(cuda_before, state.device)


class _CheckpointedLayer(torch.autograd.Function):
    """One decoder layer, checkpointed: forward saves only `hidden`; backward recomputes and back-propagates.

    Forward runs the layer without autograd and saves only its input (through `Checkpointer.save`: kept, or
    offloaded). Backward reloads the input, recomputes the layer with autograd under the RNG and autocast state
    of the forward (same dropout masks, same dtypes), back-propagates through it right there (parameter
    gradients accumulate into `.grad`, hence only through `loss.backward()`) and returns the input's gradient.
    With the checkpointer's `group_tokens`, a packed layer is recomputed and back-propagated a group of whole
    sequences at a time (`_backward_in_groups`).

    Args (forward): checkpointer, run (hidden -> layer output: a tensor or a tuple), hidden (B, T, H) layer input,
    anchor (zero-size tensor that requires grad, so the Function is part of the graph even when the first layer's
    input does not require grad), layer (its name, for messages).
    """

    @staticmethod
    def forward(ctx, checkpointer, run, hidden, anchor, layer):
        ctx.checkpointer, ctx.run = checkpointer, run
        ctx.input_requires_grad = hidden.requires_grad
        ctx.state = _capture_state(hidden.device)
        ctx.layer_input = checkpointer.save(hidden, layer)
        version = hidden._version
        with _pieces(checkpointer.group_tokens != 0), _first_forward():
            out = run(hidden)
        if hidden._version != version:
            # The copy saved for backward (queued on another stream, or this very tensor) would not be the input
            # the forward saw: the recompute would silently differ.
            raise RuntimeError(
                f"{layer} wrote into its input in place during forward; activation checkpointing "
                "needs the layer input unchanged (set speed.checkpoint = off for this model)"
            )
        return out

    @staticmethod
    def backward(ctx, *grads):
        checkpointer = ctx.checkpointer
        try:
            x = checkpointer.load(ctx.layer_input).detach()
            groups = ctx.run.groups(x, checkpointer.group_tokens_for(x)) if isinstance(ctx.run, LayerCall) else None
            if groups is not None and _only_first_has_grad(grads):
                checkpointer.grouped_layers += 1
                grad = _backward_in_groups(ctx, x, grads[0], groups)
            else:
                x.requires_grad_(ctx.input_requires_grad)
                _recompute_and_backward(ctx, x, grads)
                grad = x.grad if ctx.input_requires_grad else None
        finally:
            checkpointer.release(ctx.layer_input)
            ctx.run = ctx.layer_input = None
        return None, None, grad, None, None


def _recompute_and_backward(ctx, x: torch.Tensor, grads: tuple) -> None:
    """Rebuild the layer's graph from `x` and run its backward now: parameter gradients accumulate, and every use
    of `x` (a view of a reload buffer, also held by this graph) is queued before `release` lets the buffer go."""
    layer = ctx.run.layer if isinstance(ctx.run, LayerCall) else None
    tokens, limit = x.numel() // max(x.shape[-1], 1), ctx.checkpointer.projection_recompute_tokens
    with torch.enable_grad(), _replayed(ctx.state), recomputed_projections(layer, tokens, limit):
        out = ctx.run(x)
    outs = out if isinstance(out, tuple) else (out,)
    pairs = [
        (o, g) for o, g in zip(outs, grads, strict=False) if torch.is_tensor(o) and o.requires_grad and g is not None
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _only_first_has_grad(grads: tuple) -> bool:
    return torch.is_tensor(grads[0]) and all(g is None for g in grads[1:])


def _backward_in_groups(ctx, x: torch.Tensor, grad_out: torch.Tensor, groups) -> torch.Tensor | None:
    """The layer recomputed and back-propagated one group of whole sequences at a time
    (`hone.core.speed.checkpointing.layer_groups`):
    only one group's activations and gradients exist at once. Returns the input gradient (None if not needed)."""
    grad_in = torch.empty_like(x) if ctx.input_requires_grad else None
    for group, call in groups:
        piece = x[:, group.start : group.end].requires_grad_(ctx.input_requires_grad)
        with torch.enable_grad(), _replayed(ctx.state):
            out = call(piece)
        out = out[0] if isinstance(out, tuple) else out
        if out.requires_grad:
            torch.autograd.backward(out, grad_out[:, group.start : group.end])
        if grad_in is not None:
            grad_in[:, group.start : group.end] = piece.grad
        del out, piece  # this group's graph goes before the next group's is built
    return grad_in


def _needs_grad(value) -> bool:
    if torch.is_tensor(value):
        return value.requires_grad
    if isinstance(value, (tuple, list)):
        return any(_needs_grad(v) for v in value)
    if isinstance(value, dict):
        return any(_needs_grad(v) for v in value.values())
    return False

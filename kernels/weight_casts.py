"""Adapter weights cast to the compute dtype once per optimizer step instead of once per call.

LoRA weights are kept in fp32 next to a bf16 model, and every LoRA GEMM wants them in bf16. Between two optimizer
steps they do not change, yet forward, a checkpointed layer's recompute and backward each cast them again: on a
small model, whose step is bound by the host launching kernels, those casts are a sizeable share of all launches.
`reuse_weight_casts()` marks the stretch where the weights are constant (the trainer opens it around one step's
forward and backward passes); inside it `cast_weight` hands out one cast per weight, dtype and scale.
"""

from __future__ import annotations

import contextlib

import torch

# (id(weight), dtype, scale) -> (weight, its cast) while `reuse_weight_casts` is open; None outside it.
_CASTS: dict | None = None


@contextlib.contextmanager
def reuse_weight_casts():
    """Within this block every LoRA weight is cast to the compute dtype (and scaled) once and the cast reused.

    The caller promises the adapter weights do not change inside the block (one optimizer step's forward and
    backward passes); the casts are dropped when it closes. Nested blocks share the outer one's casts.
    """
    global _CASTS
    outer = _CASTS
    if outer is None:
        _CASTS = {}
    try:
        yield
    finally:
        _CASTS = outer


@contextlib.contextmanager
def own_weight_casts():
    """A block whose casts are its own: made inside it, never taken from or left to an enclosing block. A CUDA
    graph is recorded in one, so the recorded step casts the adapters itself and reads no tensor made outside it
    (an enclosing block's cast is freed when that block closes; the graph would read whatever comes there next)."""
    global _CASTS
    outer, _CASTS = _CASTS, {}
    try:
        yield
    finally:
        _CASTS = outer


def forget_casts(weights) -> None:
    """Drop the casts of `weights` made inside the open `reuse_weight_casts` block: their values were swapped for a
    while (the sampler runs float32 factors as bf16 copies) and a cast made then must not outlive the swap."""
    if _CASTS is None:
        return
    gone = {id(w) for w in weights}
    for key in [key for key in _CASTS if key[0] in gone]:
        del _CASTS[key]


def cast_weight(weight: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """`scale * weight` in `dtype` with one kernel (none when nothing changes), reused inside `reuse_weight_casts`."""
    if weight.dtype == dtype and scale == 1.0:
        return weight
    key = (id(weight), dtype, scale)
    if _CASTS is not None and (hit := _CASTS.get(key)) is not None and hit[0] is weight:
        return hit[1]
    if scale == 1.0:
        cast = weight.detach().to(dtype)
    else:  # multiplied in the weight's precision, rounded once into the output
        cast = torch.mul(weight.detach(), scale, out=torch.empty(weight.shape, dtype=dtype, device=weight.device))
    if _CASTS is not None:
        _CASTS[key] = (weight, cast)
    return cast

"""The MoE router with LoRA in two fused nodes: Hone's LoRA linear for the logits, one kernel for softmax + top-k.

`patch_router` gives a peft-wrapped Qwen-style router an instance forward returning (logits, weights, expert ids):

    logits = x @ W^T + scale * (x @ A^T) @ B^T        (hone.kernels.lora_linear.lora_linear: W + BA never formed)
    weights, ids = router_top_k(logits, top_k, norm_topk_prob)   (hone.kernels.moe.router)

A router qualifies only if its class's own forward gives exactly that on a small random stand-in (`router_reason`).
"""

from __future__ import annotations

import types

import torch

from hone.core.speed.fused.lora_layers import autocast_dtype_on, lora_plan
from hone.core.speed.fused.patching import Undo, swap_forward
from hone.kernels.lora_linear import lora_linear
from hone.kernels.moe.router import router_top_k, router_top_k_reference

_QUALIFIES_ATTR = "_hone_router_qualifies"


def _router_fields(router: torch.nn.Module) -> tuple[int, bool] | None:
    """(top_k, normalize) of a router module with a (E, H) `weight`, or None."""
    weight = getattr(router, "weight", None)
    top_k = getattr(router, "top_k", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not isinstance(top_k, int):
        return None
    if getattr(router, "bias", None) is not None:
        return None
    return top_k, bool(getattr(router, "norm_topk_prob", False))


def _class_forward_matches(router: torch.nn.Module, top_k: int, normalize: bool) -> bool:
    """Whether the router class's forward computes softmax -> top-k -> (renormalize) -> cast after x @ W^T: run
    on a CPU stand-in with the module's routing settings and a small random weight, compared with our formula.

    A family with another routing rule (gpt-oss's top-k before the softmax, DeepSeek's grouped sigmoid routing)
    fails here and keeps peft's path."""
    experts, hidden, rows = max(top_k + 3, 8), 12, 6
    gen = torch.Generator().manual_seed(0)
    stand_in = types.SimpleNamespace(
        weight=torch.randn(experts, hidden, generator=gen),
        top_k=top_k,
        num_experts=experts,
        norm_topk_prob=normalize,
        hidden_dim=hidden,
        training=False,
    )
    x = torch.randn(rows, hidden, generator=gen)
    try:
        with torch.no_grad():
            got = type(router).forward(stand_in, x)
    except Exception:  # a forward that needs more than the stand-in has: not the routing rule we fuse
        return False
    if not (isinstance(got, tuple) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return False
    logits = x @ stand_in.weight.T
    weights, index = router_top_k_reference(logits, top_k, normalize)
    return (
        got[0].shape == logits.shape
        and torch.allclose(got[0], logits, atol=1e-5)
        and got[2].shape == index.shape
        and torch.equal(got[2].long(), index)
        and torch.allclose(got[1].float(), weights, atol=1e-5)
    )


def router_reason(module: torch.nn.Module) -> str | None:
    """Why a peft LoRA layer is not a router `patch_router` can fuse, or None when it is."""
    if type(module).__name__ != "ParamWrapper" or not type(module).__module__.startswith("peft.tuners.lora"):
        return f"{type(module).__name__} is not a peft ParamWrapper"
    router = module.base_layer
    if getattr(module, "parameter_name", None) != "weight" or getattr(module, "num_experts", 1) != 1:
        return "not a router weight"
    if getattr(module, "fan_in_fan_out", False):
        return "fan_in_fan_out"
    if router._forward_hooks or router._forward_pre_hooks:
        return "the router has hooks"
    fields = _router_fields(router)
    if fields is None:
        return f"{type(router).__name__} has no (experts, hidden) weight and top_k (or has a bias)"
    cached = router.__dict__.get(_QUALIFIES_ATTR)
    if cached is None or cached[0] != fields:
        cached = (fields, _class_forward_matches(router, *fields))
        router.__dict__[_QUALIFIES_ATTR] = cached
    if not cached[1]:
        return f"{type(router).__name__} routes differently from softmax -> top-k"
    return None


def _fused_router_forward(self, x: torch.Tensor, *args, **kwargs):
    """peft's ParamWrapper forward around a Qwen-style router, as two fused nodes (the formula in the module
    docstring), returning (logits, routing weights, expert ids) as the router does. Anything else at call time
    (merged or disabled adapters, several adapters, dropout, extra arguments, a trained router weight, autocast
    to another dtype, `torch.compile`) falls through to peft's forward."""
    # the plain case as the fused LoRA linear reads it (kept on the wrapper between calls), without dropout
    plan = None if args or kwargs or torch.compiler.is_compiling() else lora_plan(self)
    router = self.base_layer
    weight = router.weight
    if plan is None or plan.dropout is not None or weight.requires_grad or x.shape[-1] != weight.shape[1]:
        return type(self).forward(self, x, *args, **kwargs)
    autocast_dtype = autocast_dtype_on(x)
    if autocast_dtype is not None and autocast_dtype != weight.dtype:
        return type(self).forward(self, x, *args, **kwargs)  # autocast would change the GEMMs' dtype: peft's path
    x2 = x.reshape(-1, weight.shape[1])
    x_in = x2 if x2.dtype == weight.dtype else x2.to(weight.dtype)
    logits = lora_linear(x_in, plan.lora_a, plan.lora_b, plan.scaling, weight=weight)
    weights, index = router_top_k(logits, router.top_k, bool(getattr(router, "norm_topk_prob", False)))
    return logits, weights, index


def patch_router(module: torch.nn.Module, label: str) -> Undo:
    """Route one peft-wrapped router through the fused path (`router_reason(module)` must be None).

    peft adapts a Qwen-style router (`Qwen3MoeTopKRouter`: a bare `weight` parameter, not an nn.Linear) through a
    `ParamWrapper`, whose forward registers a parametrization that forms W + scale * B @ A at every call, then runs
    the router's own softmax, top-k, renormalization and cast as separate small kernels: host time per layer and
    pass, on steps the host sets the pace of (docs/performance/host-time.md). The wrapper gets an instance forward
    instead; the returned `Undo` takes it off.
    """
    return swap_forward(module, _fused_router_forward, label)

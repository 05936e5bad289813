"""peft LoRA layers routed through Hone's LoRA linear (`hone.kernels.lora_linear`), dense and QLoRA (nf4) bases.

The peft layer stays in the model (its adapters, saving, merging and `disable_adapter()` work as before); only its
instance `forward` is swapped (`patch_lora_layer`). The one thing to know: the fused node runs only in the plain
case that `_fused_lora_forward` checks at every call (one active vanilla adapter, a frozen base, autocast off or
computing in the base's dtype, ...); every other call runs peft's own forward.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from hone.core.speed.fused.patching import Undo, swap_forward
from hone.kernels.lora_linear import lora_linear
from hone.kernels.nf4 import NF4Weight


def lora_base_kind(module: torch.nn.Module) -> tuple[str | None, str]:
    """("lora_linear" | "qlora_linear" | None, why not) for a peft LoRA layer."""
    cls = type(module)
    if not cls.__module__.startswith("peft.tuners.lora") or cls.__name__ not in ("Linear", "Linear4bit"):
        return None, f"{cls.__module__}.{cls.__name__} is not a peft LoRA linear layer"
    if getattr(module, "fan_in_fan_out", False):
        return None, "fan_in_fan_out (Conv1D) base layers are not supported"
    base = module.base_layer
    if base._forward_hooks or base._forward_pre_hooks or getattr(base, "_hf_hook", None) is not None:
        return None, "the base layer has hooks (e.g. offloaded by accelerate)"
    if type(base) is torch.nn.Linear:
        return "lora_linear", ""
    weight = getattr(base, "weight", None)
    state = getattr(weight, "quant_state", None)
    if type(base).__name__ == "Linear4bit" and state is not None:
        if state.quant_type != "nf4":
            return None, f"4-bit quant type {state.quant_type!r} (only nf4 is fused)"
        if getattr(state, "packing_format_for_cpu", False):
            return None, "bitsandbytes repacked this weight for its CPU inference kernel"
        return "qlora_linear", ""
    return None, f"base layer {type(base).__name__} is neither nn.Linear nor an nf4 Linear4bit"


def _nf4_compute_dtype(base, x: torch.Tensor) -> torch.dtype:
    return base.compute_dtype if getattr(base, "compute_dtype", None) is not None else x.dtype


@functools.cache
def _has_autocast(device_type: str) -> bool:
    return torch.amp.is_autocast_available(device_type)


def autocast_dtype_on(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes in on x's device, or None when autocast is off there."""
    device_type = x.device.type
    if not _has_autocast(device_type) or not torch.is_autocast_enabled(device_type):
        return None  # (meta tensors of step plans: a device without autocast)
    return torch.get_autocast_dtype(device_type)


class _Plan(NamedTuple):
    """What one call of a layer in the plain case needs, read from its modules once (see `lora_plan`)."""

    lora_a: torch.nn.Parameter
    lora_b: torch.nn.Parameter
    scaling: float
    base: torch.nn.Module
    quantized: bool
    dropout: torch.nn.Module | None  # None: no dropout (p = 0, identity, or eval mode)


_PLAN_ATTR = "_hone_lora_plan"


def lora_plan(self) -> _Plan | None:
    """The layer's plan for the plain case, or None when peft's own forward must run.

    Building it reads a dozen submodule attributes (each an `nn.Module.__getattr__`); the layer is called
    hundreds of times per step, so the plan is kept and rebuilt only when the adapter state it depends on changes:
    disabled or merged adapters, the active adapter, the set of adapters, training mode.
    """
    active = self.active_adapter
    key = (
        self.disable_adapters,
        self.merged,
        active if isinstance(active, str) else tuple(active),
        len(self.lora_A),
        self.training,
    )
    cached = self.__dict__.get(_PLAN_ATTR)
    if cached is not None and cached[0] == key:
        return cached[1]
    plan = None
    names = [name for name in self.active_adapters if name in self.lora_A]
    if (
        not self.disable_adapters
        and not self.merged
        and len(names) == 1
        and names[0] not in getattr(self, "lora_variant", {})
    ):
        name = names[0]
        lora_a, lora_b = self.lora_A[name], self.lora_B[name]
        if (
            type(lora_a) is torch.nn.Linear
            and type(lora_b) is torch.nn.Linear
            and lora_a.bias is None
            and lora_b.bias is None
        ):
            dropout = self.lora_dropout[name]
            if not self.training or isinstance(dropout, torch.nn.Identity) or getattr(dropout, "p", 1.0) <= 0:
                dropout = None
            base = self.base_layer
            plan = _Plan(
                lora_a.weight,
                lora_b.weight,
                float(self.scaling[name]),
                base,
                hasattr(base.weight, "quant_state"),
                dropout,
            )
    self.__dict__[_PLAN_ATTR] = (key, plan)
    return plan


def _fused_lora_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """peft's `lora.Linear.forward` for the plain case in one autograd node; peft's own forward otherwise.

    The plain case: one active vanilla adapter (no DoRA or other variant, no `adapter_names` mixing), not merged,
    not disabled, a frozen `nn.Linear` or nf4 `Linear4bit` base without hooks (`lora_base_kind`), no extra
    arguments, not inside `torch.compile`, and under autocast only when autocast computes in the base's compute
    dtype (a bf16 model under bf16 autocast, as the trainer runs it on a GPU): there autocast changes no dtype of
    the fused node's GEMMs, and the output has peft's dtype. What the checks read from the submodules is kept
    between calls (`lora_plan`). Dropout runs through the layer's own `lora_dropout` module on the same input as in
    peft, so a fixed seed draws the same mask; its output is kept in the compute dtype (what the GEMMs read anyway).

    Args:
        x: (..., in_features) input.

    Returns:
        (..., out_features); on the fused path in x's dtype.
    """
    plan = None if args or kwargs or torch.compiler.is_compiling() else lora_plan(self)
    if plan is None or x.shape[-1] != plan.lora_a.shape[1]:
        return type(self).forward(self, x, *args, **kwargs)
    base = plan.base
    weight = base.weight
    compute_dtype = _nf4_compute_dtype(base, x) if plan.quantized else weight.dtype
    if weight.requires_grad or (not plan.quantized and x.dtype != compute_dtype):
        return type(self).forward(self, x, *args, **kwargs)
    autocast_dtype = autocast_dtype_on(x)
    if autocast_dtype is not None and autocast_dtype != compute_dtype:
        return type(self).forward(self, x, *args, **kwargs)  # autocast would change the GEMMs' dtype: peft's path

    # Autocast, when on, computes in compute_dtype: every GEMM below already gets compute_dtype inputs, so it
    # changes nothing and is left on (switching it off and on again costs host time at every call).
    x_lora = None
    if plan.dropout is not None:
        x_lora = plan.dropout(self._cast_input_dtype(x, plan.lora_a.dtype)).to(compute_dtype)
    bias = base.bias
    if bias is not None and bias.dtype != compute_dtype:
        bias = bias.to(compute_dtype)
    x_in = x if x.dtype == compute_dtype else x.to(compute_dtype)
    if plan.quantized:
        out = lora_linear(
            x_in,
            plan.lora_a,
            plan.lora_b,
            plan.scaling,
            bias=bias,
            x_lora=x_lora,
            nf4=NF4Weight.from_params4bit(weight),
        )
    else:
        out = lora_linear(x_in, plan.lora_a, plan.lora_b, plan.scaling, bias=bias, x_lora=x_lora, weight=weight)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def patch_lora_layer(module: torch.nn.Module, label: str) -> Undo:
    """Route one peft LoRA layer through the fused LoRA linear (see `lora_base_kind` for which qualify)."""
    return swap_forward(module, _fused_lora_forward, label)

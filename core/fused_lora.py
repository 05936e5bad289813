"""peft LoRA layers routed through Hone's LoRA linear (`hone.kernels.lora`), dense and QLoRA (nf4) bases.

The peft layer stays in the model (its adapters, saving, merging and `disable_adapter()` work as before); only
its instance `forward` is swapped. Each call checks that it is the plain case: one active vanilla adapter (no
DoRA or other variant, no `adapter_names` mixing), not merged, not disabled, a frozen `nn.Linear` or nf4
`Linear4bit` base without hooks, not inside `torch.compile`, and under autocast only when autocast computes in
the base's compute dtype (a bf16 model under bf16 autocast, as the trainer runs it on a GPU): there autocast
would change no dtype, so it is switched off around the fused node and the output has peft's dtype. Anything
else runs peft's own forward. Dropout runs through the layer's own `lora_dropout` module on the same input as in
peft, so a fixed seed draws the same mask; its output is kept in the compute dtype (what the GEMMs read anyway).
"""

from __future__ import annotations

import contextlib

import torch

from hone.core.fused_patch import Undo, swap_forward
from hone.kernels.lora import lora_linear
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


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes in on x's device, or None when autocast is off there."""
    device_type = x.device.type
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None  # (meta tensors of step plans: a device without autocast)
    return torch.get_autocast_dtype(device_type)


def _fused_lora_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """peft's `lora.Linear.forward` for the plain case in one autograd node; peft's own forward otherwise."""
    if args or kwargs or self.disable_adapters or self.merged or torch.compiler.is_compiling():
        return type(self).forward(self, x, *args, **kwargs)
    active = [name for name in self.active_adapters if name in self.lora_A]
    if len(active) != 1 or active[0] in getattr(self, "lora_variant", {}):
        return type(self).forward(self, x, *args, **kwargs)
    name = active[0]
    lora_a, lora_b, base = self.lora_A[name], self.lora_B[name], self.base_layer
    if lora_a.bias is not None or lora_b.bias is not None or type(lora_a) is not torch.nn.Linear \
            or type(lora_b) is not torch.nn.Linear or x.shape[-1] != lora_a.in_features:
        return type(self).forward(self, x, *args, **kwargs)

    quantized = hasattr(base.weight, "quant_state")
    compute_dtype = _nf4_compute_dtype(base, x) if quantized else base.weight.dtype
    if base.weight.requires_grad or (not quantized and x.dtype != compute_dtype):
        return type(self).forward(self, x, *args, **kwargs)
    autocast_dtype = _autocast_dtype(x)
    if autocast_dtype is not None and autocast_dtype != compute_dtype:
        return type(self).forward(self, x, *args, **kwargs)  # autocast would change the GEMMs' dtype: peft's path

    dropout = self.lora_dropout[name]
    x_lora = None
    if self.training and not isinstance(dropout, torch.nn.Identity) and getattr(dropout, "p", 1.0) > 0:
        x_lora = dropout(self._cast_input_dtype(x, lora_a.weight.dtype)).to(compute_dtype)
    bias = base.bias if base.bias is None or base.bias.dtype == compute_dtype else base.bias.to(compute_dtype)
    x_in = x if x.dtype == compute_dtype else x.to(compute_dtype)
    no_autocast = torch.autocast(x.device.type, enabled=False) if autocast_dtype else contextlib.nullcontext()
    with no_autocast:
        if quantized:
            out = lora_linear(x_in, lora_a.weight, lora_b.weight, self.scaling[name], bias=bias, x_lora=x_lora,
                              nf4=NF4Weight.from_params4bit(base.weight))
        else:
            out = lora_linear(x_in, lora_a.weight, lora_b.weight, self.scaling[name], bias=bias, x_lora=x_lora,
                              weight=base.weight)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def patch_lora_layer(module: torch.nn.Module, label: str) -> Undo:
    """Route one peft LoRA layer through the fused LoRA linear (see `lora_base_kind` for which qualify)."""
    return swap_forward(module, _fused_lora_forward, label)

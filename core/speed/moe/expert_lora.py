"""LoRA on MoE experts in peft's own format, computed split: (X_e A_e) B_e per expert group, never W + BA.

peft adapts stacked expert weights through `LoraConfig(target_parameters=expert_lora_targets(model))`, one
`ParamWrapper` per parameter, whose forward forms W + scale * B @ A for all experts. `install_split_lora` keeps
peft's wrappers, parameters and names (the saved adapter is a plain peft adapter) and only switches the outermost
wrapper's class to `SplitLoraParamWrapper`, which hands the factors to Hone's experts backend instead;
`revert_split_lora` undoes it. LoRA dropout goes to `install_split_lora`, not to the LoraConfig (it says why).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from hone.core.models.hub_kernels import guard_bitsandbytes_import
from hone.core.speed.moe.experts import (
    LORA_CALL_ATTR,
    find_experts,
    is_experts_module,
    is_hone_active,
    unsupported_reason,
)
from hone.kernels.moe.experts import LoraFactors

guard_bitsandbytes_import()  # peft imports bitsandbytes: its first import stays off the Hub (see that module)
from peft.tuners.lora.layer import LoraLayer, ParamWrapper  # noqa: E402

_UP_NAMES = ("gate_up_proj", "up_proj")
_DROPOUT_ATTR = "_hone_split_dropout"
_REPLACED_DROPOUTS_ATTR = "_hone_replaced_dropouts"


def expert_lora_targets(model: nn.Module) -> list[str]:
    """`LoraConfig(target_parameters=...)` entries that adapt every experts layer's up and down weights.

    Names are module paths with the layer index cut off ("mlp.experts.gate_up_proj"), which peft matches as
    suffixes; [] for a model without experts.
    """
    targets: list[str] = []
    for name, module in find_experts(model):
        # peft matches against the unwrapped name; drop "base_model.model.", "base_layer." and the layer prefix.
        name = re.sub(r"(^|\.)base_layer(?=\.|$)", "", name)
        tail = re.split(r"(?:^|\.)\d+\.", name)[-1]
        up = "gate_up_proj" if module.has_gate else "up_proj"
        for param in (up, "down_proj"):
            entry = f"{tail}.{param}" if tail else param
            if entry not in targets:
                targets.append(entry)
    return targets


def _chain(outer: nn.Module) -> list[nn.Module]:
    """The nested ParamWrappers from the outermost inward."""
    chain = [outer]
    while isinstance(chain[-1].base_layer, ParamWrapper):
        chain.append(chain[-1].base_layer)
    return chain


def _factors(wrapper: nn.Module, adapter: str, dropout: float) -> LoraFactors:
    """peft's A (r * E, in) and B (out, r * E) of one ParamWrapper as (E, in, r) and (E, r, out) factors.

    peft lays A out expert-major (row e * r + j) and B rank-major (column j * E + e); see
    `ParamWrapper.get_delta_weight`.
    """
    a = wrapper.lora_A[adapter].weight
    b = wrapper.lora_B[adapter].weight
    experts, rank = wrapper.num_experts, wrapper.r[adapter]
    a_kn = a.view(experts, rank, a.shape[1]).transpose(1, 2)
    b_kn = b.view(b.shape[0], rank, experts).permute(2, 1, 0)  # made contiguous by the cast to bf16
    return LoraFactors(a=a_kn, b=b_kn, scale=float(wrapper.scaling[adapter]), dropout=dropout)


def _split_factors(outer: nn.Module) -> dict[str, LoraFactors] | None:
    """The LoRA factors for Hone's split path, or None when peft's own forward must run."""
    base = outer.get_base_layer()
    if not is_experts_module(base) or not is_hone_active(base) or unsupported_reason(base) is not None:
        return None
    chain = _chain(outer)
    adapters = outer.active_adapters
    if len(adapters) != 1 or any(w.disable_adapters or w.merged for w in chain):
        return None
    adapter = adapters[0]
    dropout = getattr(outer, _DROPOUT_ATTR, 0.0)
    factors: dict[str, LoraFactors] = {}
    for wrapper in chain:
        if adapter not in wrapper.lora_A:
            continue
        role = (
            "up" if wrapper.parameter_name in _UP_NAMES else "down" if wrapper.parameter_name == "down_proj" else None
        )
        if role is None:
            return None  # a parameter the split path does not know (e.g. a bias): let peft handle the module
        factors[role] = _factors(wrapper, adapter, dropout)
    return factors


class SplitLoraParamWrapper(ParamWrapper):
    """peft's ParamWrapper whose forward runs the experts' LoRA split inside Hone's experts implementation.

    peft's `lora.ParamWrapper` (one per targeted parameter, nested when a module has several) holds A as a Linear
    (in, r * E) and B as a Linear (r * E, out), and on every forward registers a parametrization that forms
    W + scale * B @ A for all experts at once. This forward hands the LoRA factors to Hone's experts implementation
    for that call and calls the experts module directly, so the parametrization is never built. Anything the split
    path does not cover (merged or disabled adapters, several active adapters, a non-Hone experts implementation)
    falls through to peft's own forward.

    Only the class of an existing wrapper changes (`install_split_lora`); its state is peft's, so `save_pretrained`
    writes, and `PeftModel.from_pretrained` reads, a plain peft adapter.
    """

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        factors = None if kwargs.get("adapter_names") else _split_factors(self)
        if factors is None:
            return super().forward(x, *args, **kwargs)
        base = self.get_base_layer()
        setattr(base, LORA_CALL_ATTR, factors)
        try:
            return base(x, *args, **kwargs)
        finally:
            setattr(base, LORA_CALL_ATTR, None)


def _outer_wrappers(model: nn.Module) -> list[nn.Module]:
    outer = []
    for parent in model.modules():
        if isinstance(parent, ParamWrapper):
            continue
        for child in parent.children():
            if isinstance(child, ParamWrapper) and is_experts_module(child.get_base_layer()):
                outer.append(child)
    return outer


def install_split_lora(peft_model: nn.Module, dropout: float = 0.0) -> int:
    """Make expert LoRA compute (X_e A_e) B_e within each group instead of peft's W + BA (`SplitLoraParamWrapper`).

    Call after `get_peft_model(model, LoraConfig(target_parameters=expert_lora_targets(model), ...))`. The split
    runs while the experts use a Hone backend (`configure`); otherwise peft's own forward runs.

    Dropout: peft rejects `lora_dropout > 0` in a config that has `target_parameters`, so such a LoraConfig is built
    with `lora_dropout=0` and the dropout is given here, which sets it on every LoRA layer: the linear ones get the
    `nn.Dropout` peft would have made, the experts drop their LoRA input rows. The saved adapter then records
    `lora_dropout=0`, which is what lets peft load it (dropout does not change inference outputs).

    Args:
        peft_model: the peft model.
        dropout: LoRA dropout for every adapted layer (the LoraConfig must carry lora_dropout=0, see above).

    Returns:
        The number of experts layers switched to the split path.
    """
    count = 0
    for wrapper in _outer_wrappers(peft_model):
        if type(wrapper) is ParamWrapper:
            wrapper.__class__ = SplitLoraParamWrapper
        setattr(wrapper, _DROPOUT_ATTR, float(dropout))
        count += 1
    if dropout > 0:
        _set_linear_dropout(peft_model, dropout)
    return count


def _set_linear_dropout(peft_model: nn.Module, dropout: float) -> None:
    """Give the linear LoRA layers the nn.Dropout peft would have made for LoraConfig(lora_dropout=dropout)."""
    for module in peft_model.modules():
        if not isinstance(module, LoraLayer) or isinstance(module, ParamWrapper):
            continue
        replaced = getattr(module, _REPLACED_DROPOUTS_ATTR, {})
        for adapter, layer in list(module.lora_dropout.items()):
            if isinstance(layer, nn.Identity):
                replaced[adapter] = layer
                module.lora_dropout[adapter] = nn.Dropout(p=dropout)
        setattr(module, _REPLACED_DROPOUTS_ATTR, replaced)


def revert_split_lora(peft_model: nn.Module) -> None:
    """Undo `install_split_lora`: peft's own ParamWrapper forward and the dropout layers it had."""
    for wrapper in _outer_wrappers(peft_model):
        if type(wrapper) is SplitLoraParamWrapper:
            wrapper.__class__ = ParamWrapper
        if hasattr(wrapper, _DROPOUT_ATTR):
            delattr(wrapper, _DROPOUT_ATTR)
    for module in peft_model.modules():
        replaced = getattr(module, _REPLACED_DROPOUTS_ATTR, None)
        if replaced is None:
            continue
        for adapter, layer in replaced.items():
            module.lora_dropout[adapter] = layer
        delattr(module, _REPLACED_DROPOUTS_ATTR)

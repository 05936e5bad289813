"""Mixture-of-experts speed path: routing grouped once, grouped-GEMM backends, split LoRA on experts.

What a run calls, in order:

    from hone.core import moe

    targets = moe.expert_lora_targets(model)              # LoraConfig(target_parameters=targets, lora_dropout=0)
    peft_model = get_peft_model(model, lora_config)
    moe.install_split_lora(peft_model, dropout=lora.dropout)   # expert LoRA as (X_e A_e) B_e, never W + BA
    choice = moe.configure(peft_model, speed.moe_backend, device)  # Choice(name, reason) for RunStarted
    meter = moe.ExpertLoadMeter(peft_model)               # meter.read_and_reset() -> StepMetrics.expert_load

Backends: grouped_mm (torch._grouped_mm), triton (Hone's kernels), torch (a loop over expert groups), eager
(transformers' own loop; with peft's W + BA on LoRA). The first three are registered in transformers'
`ExpertsInterface` as hone_grouped_mm / hone_triton / hone_torch.
"""

from hone.core.moe.choice import BACKENDS, ENV_VAR, Choice, configure, probe
from hone.core.moe.expert_lora import SplitLoraParamWrapper, expert_lora_targets, install_split_lora, revert_split_lora
from hone.core.moe.experts import (
    IMPLEMENTATIONS,
    apply_backend,
    current_implementation,
    expert_weights,
    find_experts,
    register,
    revert_backend,
    set_fused_gate,
)
from hone.core.moe.load import ExpertLoadMeter

__all__ = [
    "BACKENDS", "ENV_VAR", "IMPLEMENTATIONS", "Choice", "ExpertLoadMeter", "SplitLoraParamWrapper",
    "apply_backend", "configure", "current_implementation", "expert_lora_targets", "expert_weights",
    "find_experts", "install_split_lora", "probe", "register", "revert_backend", "revert_split_lora", "set_fused_gate",
]

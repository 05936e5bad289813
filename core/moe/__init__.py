"""Mixture-of-experts speed path: Hone's experts backends behind transformers' `ExpertsInterface`, split LoRA on the
experts, the backend choice and the expert-load meter.

    choice.py       `configure`: which backend a run uses and why (`auto` probes); the `Choice` goes to RunStarted
    experts.py      hone_grouped_mm / hone_triton / hone_torch in `ExpertsInterface`; apply_backend / revert_backend
    expert_lora.py  peft's expert LoRA as (X_e A_e) B_e, never W + BA; install_split_lora / revert_split_lora
    load.py         `ExpertLoadMeter`: tokens per expert, `read_and_reset()` -> StepMetrics.expert_load

A run calls `configure(model, speed.moe_backend, device)` and `ExpertLoadMeter(model)` before LoRA
(core/speed/__init__.py), then `get_peft_model` with `LoraConfig(target_parameters=expert_lora_targets(model),
lora_dropout=0)` and `install_split_lora(peft_model, dropout=lora.dropout)` (core/train/lora.py). Backends:
grouped_mm (torch._grouped_mm), triton (Hone's kernels), torch (a loop over expert groups), eager (transformers'
own loop, with peft's W + BA on LoRA).
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

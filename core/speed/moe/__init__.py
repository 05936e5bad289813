"""Mixture-of-experts speed path: Hone's experts backends behind transformers' `ExpertsInterface`, split LoRA on the
experts, the backend choice and the expert-load meter.

    choice.py       `configure`: which backend a run uses and why (`auto` probes); the `Choice` goes to RunStarted
    experts.py      hone_grouped_mm / hone_triton / hone_torch in `ExpertsInterface`; apply_backend / revert_backend
    expert_lora.py  peft's expert LoRA as (X_e A_e) B_e, never W + BA; install_split_lora / revert_split_lora
    expert_load.py  `ExpertLoadMeter`: tokens per expert, `read_and_reset()` -> StepMetrics.expert_load
    fused_router.py a Qwen-style router with LoRA as the LoRA linear plus one softmax + top-k kernel (speed.kernels)

A run calls `configure(model, speed.moe_backend, device)` and `ExpertLoadMeter(model)` before LoRA
(core/speed/paths.py), then `get_peft_model` with `LoraConfig(target_parameters=expert_lora_targets(model),
lora_dropout=0)` and `install_split_lora(peft_model, dropout=lora.dropout)` (core/train/lora.py). Backends:
grouped_mm (torch._grouped_mm), triton (Hone's kernels), torch (a loop over expert groups), eager (transformers'
own loop, with peft's W + BA on LoRA).

Besides: `families` (the MoE families Hone knows, stdlib only: the Model page reads it without torch) and
`family_report` (what is read from a loaded model). Importing this package is light; names load on use.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "hone.core.speed.moe.choice": ("BACKENDS", "ENV_VAR", "Choice", "configure", "probe"),
    "hone.core.speed.moe.expert_lora": (
        "SplitLoraParamWrapper",
        "expert_lora_targets",
        "install_split_lora",
        "revert_split_lora",
    ),
    "hone.core.speed.moe.experts": (
        "IMPLEMENTATIONS",
        "apply_backend",
        "current_implementation",
        "expert_weights",
        "find_experts",
        "register",
        "revert_backend",
        "set_fused_gate",
    ),
    "hone.core.speed.moe.expert_load": ("ExpertLoadMeter",),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

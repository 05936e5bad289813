"""Tiny MoE models and peft adapters for the MoE tests (imported by them; pytest puts this folder on sys.path).

The shapes' tiny sizes make some expert matrices square (Qwen3's gate_up is (E, 64, 64)), which would hide a mixed
up in/out; these builders use sizes where every expert dimension differs.
"""

from __future__ import annotations

import torch

# Every expert dimension distinct: hidden 64, intermediate 24 (so gate_up is 48 wide), experts 5 (prime).
ASYMMETRIC = {
    "tiny-moe-qwen3": {"moe_intermediate_size": 24, "num_experts": 5},
    "tiny-moe-gptoss": {"intermediate_size": 24, "num_local_experts": 5},
    "tiny-moe-qwen2": {"moe_intermediate_size": 24, "num_experts": 5},
}
MOE_SHAPES = list(ASYMMETRIC)


def build_tiny_moe(shape: str, layers: int = 2, seed: int = 0, **overrides):
    from hone.core.models.shapes import build_model

    return build_model(shape, layers=layers, seed=seed, **(ASYMMETRIC[shape] | overrides))


def add_lora(model, rank: int = 4, alpha: float = 8.0, seed: int = 1, random_b: bool = True):
    """peft LoRA on q/v projections and on the experts (peft's own target_parameters format)."""
    from peft import LoraConfig, get_peft_model

    from hone.core.speed import moe

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        target_parameters=moe.expert_lora_targets(model),
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, config)
    if random_b:  # peft starts B at zero; a nonzero B makes the LoRA path visible in the outputs
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return peft_model


def token_batch(seed: int = 0, batch: int = 2, length: int = 12):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2000, (batch, length), generator=gen)

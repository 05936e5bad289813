"""A tiny random-init model with peft LoRA on every projection and non-zero B matrices, shared by the fused-kernel
tests (peft starts B at zero, which would hide any mistake in the adapters' path)."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from hone.core.models.shapes import build_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_model(
    shape: str = "tiny-dense",
    *,
    vocab: int,
    layers: int = 2,
    seed: int = 0,
    dropout: float = 0.0,
    dtype: torch.dtype | None = None,
):
    model = build_model(shape, layers=layers, seed=seed, vocab_size=vocab)  # a small vocabulary keeps CPU steps fast
    if dtype is not None:
        model = model.to(dtype)
    torch.manual_seed(seed)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(len(name)))
    return model

"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math

import torch

from hone.core.config import TrainConfig
from hone.core.errors import ConfigError


def build_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig, device: str) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA: one kernel for all parameters) or bitsandbytes' 8-bit AdamW."""
    if cfg.optimizer == "adamw8bit":
        if not str(device).startswith("cuda"):
            raise ConfigError("train.optimizer = adamw8bit needs an NVIDIA GPU; this run is on the CPU",
                              "use train.optimizer = adamw")
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise ConfigError("train.optimizer = adamw8bit needs the bitsandbytes package",
                              "pip install bitsandbytes, or use train.optimizer = adamw") from None
        return bnb.optim.AdamW8bit(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    fused = str(device).startswith("cuda")
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)


def warmup_steps(cfg: TrainConfig, total_steps: int) -> int:
    return cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total_steps)


def lr_factor(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step`: linear warmup (the first step already
    moves), then cosine / linear decay towards 0 or constant."""
    warmup = warmup_steps(cfg, total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup)
    if cfg.schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))

"""GRPO's math: group-normalized advantages and the clipped surrogate loss with an optional KL term.

Conventions (as TRL's GRPOTrainer): a batch holds B completions, G per prompt, group k = rows kG … kG+G-1.
- Advantages: reward minus its group's mean, divided by the std (+1e-4) of the group (`scale_rewards="group"`),
  of the whole batch ("batch"), or not at all ("none"). Stds are Bessel-corrected. A NaN reward (a reward that raised)
  is left out of the statistics and gets advantage 0.
- Per token: ratio r = exp(logp - old_logp); loss = -min(r·A, clip(r, 1-ε_low, 1+ε_high)·A) + β·KL, with KL the k3
  estimator exp(ref - logp) - (ref - logp) - 1 against the reference (the adapter off), weighted by r when
  `kl_bias_correction` (TRL's default: the importance-sampling correction of a KL estimated on old samples).
- Normalization: "grpo" the token mean of each sequence, then the mean over sequences; "dr_grpo" the token sum over
  B × max_completion_length; "dapo" the token mean over all the batch's completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
# TRL's guard against a zero std (a group whose completions all scored the same).
STD_EPS = 1e-4


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Bessel-corrected std ignoring NaNs; NaN where fewer than two values are finite."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) * count / (count - 1).clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), torch.full_like(var, float("nan")))
    return std.squeeze(dim) if dim is not None else std.reshape(())


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """(B,) fp32 advantages from (B,) rewards (NaN = not scored: advantage 0), B a multiple of `group_size`."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, not {scale_rewards!r}")
    rewards = rewards.float()
    grouped = rewards.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size)
    advantages = rewards - mean
    if scale_rewards == "group":
        std = _nanstd(grouped, dim=1).repeat_interleave(group_size) if group_size > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    elif scale_rewards == "batch":
        std = _nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = advantages / (std + STD_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


@dataclass(frozen=True)
class GrpoLoss:
    """The batch's loss (0-d, differentiable) as TRL reports it, and detached metrics: the mean KL per completion
    token (0 when β = 0 and no reference was given) and the share of completion tokens whose ratio was clipped."""

    loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    kl_bias_correction: bool = True,
) -> GrpoLoss:
    """GRPO's loss of B completions.

    Args:
        logps: (B, T) fp32 per-token log-probabilities of the completion tokens under the policy (with grad).
        old_logps: (B, T) the same under the policy that sampled them (detached).
        advantages: (B,) fp32.
        mask: (B, T) 1 on real completion tokens, 0 on padding.
        ref_logps: (B, T) under the reference; needed when beta != 0.
        epsilon, epsilon_high: the clip range [1 - epsilon, 1 + epsilon_high] (epsilon_high None: epsilon).
        loss_type: grpo, dr_grpo or dapo; dr_grpo needs max_completion_length.
        kl_bias_correction: weight each token's KL by its ratio r (see the module docstring).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, not {loss_type!r}")
    mask = mask.to(logps.dtype)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    ratio = torch.exp(logps - old_logps)
    adv = advantages[:, None]
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - epsilon, 1 + eps_high) * adv)
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs the reference log-probabilities")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        if kl_bias_correction:
            kl = kl * ratio
        per_token = per_token + beta * kl
    tokens = mask.sum().clamp(min=1.0)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("dr_grpo needs max_completion_length")
        loss = (per_token * mask).sum() / (per_token.shape[0] * max_completion_length)
    else:
        loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        clip_fraction = (clipped.to(mask.dtype) * mask).sum() / tokens
        kl_mean = (kl * mask).sum() / tokens if kl is not None else logps.new_zeros(())
    return GrpoLoss(loss, kl_mean.detach(), clip_fraction)

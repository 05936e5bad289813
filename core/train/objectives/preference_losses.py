"""The preference losses, per pair, from the summed log-probabilities of each pair's chosen and rejected answer.

Every function takes (P,) fp32 tensors and returns the (P,) per-pair losses and the implicit rewards of both
answers (detached, for the metrics: how far the fine-tune prefers the chosen answer). The trainer sums the losses
over a step's pairs and divides by their number.

- DPO (Rafailov et al.): the policy's log-ratio against the reference (the same weights, adapter off) on the chosen
  minus the rejected answer, delta; `sigmoid` -log σ(β·delta), with label smoothing ε the conservative form
  -(1-ε)·log σ(β·delta) - ε·log σ(-β·delta); `robust` (Chowdhury et al.) the unbiased correction
  (-(1-ε)·log σ(β·delta) + ε·log σ(-β·delta)) / (1 - 2ε); `ipo` (Azar et al.) (delta' - 1/(2β))² with delta'
  from per-token averages of the log-probabilities. Rewards: β·(policy - reference) of each answer.
- SimPO (Meng et al.): no reference; per-token averages, -(1-ε)·log σ(β·m) - ε·log σ(-β·m) with
  m = avg_chosen - avg_rejected - γ/β. Rewards: β·avg of each answer.
- ORPO (Hong et al.): no reference; the chosen answers' NLL (a mean over the micro-batch's chosen tokens, as TRL's
  ORPOTrainer takes it) plus λ·(-log σ(log-odds)), the log-odds ratio of the per-token averages a:
  (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r)). Rewards: λ·avg of each answer (TRL's, whose `beta` is λ).
- KTO (Ethayarajh et al.) on single answers with a desirable or undesirable label: with r = β·(policy - reference)
  and z the detached, clamped estimate of KL(policy ‖ reference) from mismatched prompts and answers, a desirable
  answer's loss is w_d·(1 - σ(r - β·z)), an undesirable one's w_u·(1 - σ(β·z - r)). Rewards: r.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PairLogprobs:
    """Per pair: summed log-probabilities of the chosen and rejected answers' tokens, and their token counts;
    the reference model's sums where the method has one (else None). All (P,) fp32."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None


@dataclass(frozen=True)
class PairLosses:
    """(P,) losses, and the (P,) detached rewards of the chosen and the rejected answers."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def _smoothed_sigmoid(x: torch.Tensor, smoothing: float) -> torch.Tensor:
    """-(1-ε)·log σ(x) - ε·log σ(-x): the logistic loss with an ε share of labels assumed flipped."""
    loss = -F.logsigmoid(x)
    return loss if smoothing == 0 else (1 - smoothing) * loss - smoothing * F.logsigmoid(-x)


def dpo_losses(pairs: PairLogprobs, *, beta: float, loss: str = "sigmoid", label_smoothing: float = 0.0) -> PairLosses:
    """DPO's per-pair losses (`loss`: sigmoid, robust or ipo); see the module docstring."""
    if pairs.ref_chosen is None or pairs.ref_rejected is None:
        raise ValueError("DPO needs the reference model's log-probabilities")
    chosen_ratio = pairs.chosen - pairs.ref_chosen
    rejected_ratio = pairs.rejected - pairs.ref_rejected
    if loss == "sigmoid":
        losses = _smoothed_sigmoid(beta * (chosen_ratio - rejected_ratio), label_smoothing)
    elif loss == "robust":
        delta = beta * (chosen_ratio - rejected_ratio)
        eps = label_smoothing
        losses = (-(1 - eps) * F.logsigmoid(delta) + eps * F.logsigmoid(-delta)) / (1 - 2 * eps)
    elif loss == "ipo":
        averaged = chosen_ratio / pairs.chosen_tokens.clamp(min=1) - rejected_ratio / pairs.rejected_tokens.clamp(min=1)
        losses = (averaged - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss {loss!r}")
    return PairLosses(losses, (beta * chosen_ratio).detach(), (beta * rejected_ratio).detach())


def simpo_losses(pairs: PairLogprobs, *, beta: float, gamma: float, label_smoothing: float = 0.0) -> PairLosses:
    """SimPO's per-pair losses; see the module docstring."""
    chosen = pairs.chosen / pairs.chosen_tokens.clamp(min=1)
    rejected = pairs.rejected / pairs.rejected_tokens.clamp(min=1)
    margin = chosen - rejected - gamma / beta
    losses = _smoothed_sigmoid(beta * margin, label_smoothing)
    return PairLosses(losses, (beta * chosen).detach(), (beta * rejected).detach())


@dataclass(frozen=True)
class OrpoLosses(PairLosses):
    """ORPO's per-pair losses and rewards, with its two parts for the metrics: the micro-batch's chosen NLL (a
    0-d tensor) and each pair's log-odds ratio ((P,)), both detached."""

    nll: torch.Tensor | None = None
    log_odds: torch.Tensor | None = None


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate on both sides of -log 2 (Mächler's rule: log1p where e^x is small, expm1
    where it is near 1)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_losses(pairs: PairLogprobs, *, lam: float) -> OrpoLosses:
    """ORPO's per-pair losses: each pair carries the micro-batch's mean chosen NLL once, so their sum over P pairs
    divided by P is TRL's batch loss; see the module docstring."""
    chosen = pairs.chosen / pairs.chosen_tokens.clamp(min=1)
    rejected = pairs.rejected / pairs.rejected_tokens.clamp(min=1)
    nll = -pairs.chosen.sum() / pairs.chosen_tokens.sum().clamp(min=1)
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    losses = nll - lam * F.logsigmoid(log_odds)
    return OrpoLosses(
        losses, (lam * chosen).detach(), (lam * rejected).detach(), nll=nll.detach(), log_odds=log_odds.detach()
    )


@dataclass(frozen=True)
class KtoLosses:
    """(N,) losses of N single answers and their (N,) detached rewards; `kl` the 0-d detached KL estimate."""

    losses: torch.Tensor
    rewards: torch.Tensor
    kl: torch.Tensor


def kto_losses(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl_logps: torch.Tensor,
    ref_kl_logps: torch.Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KtoLosses:
    """KTO's per-answer losses.

    Args:
        logps, ref_logps: (N,) fp32 summed log-probabilities of each answer under the policy and the reference.
        desirable: (N,) bool, each answer's label.
        kl_logps, ref_kl_logps: (M,) fp32 the same for the mismatched prompt-answer sequences; their mean log-ratio,
            clamped at 0 and detached, is the reference point z.
    """
    kl = (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)
    ratio = logps - ref_logps
    good = torch.where(desirable, 1 - torch.sigmoid(beta * (ratio - kl)), torch.zeros_like(ratio))
    bad = torch.where(desirable, torch.zeros_like(ratio), 1 - torch.sigmoid(beta * (kl - ratio)))
    losses = desirable_weight * good + undesirable_weight * bad
    return KtoLosses(losses, (beta * ratio).detach(), kl)

"""GRPO's rollouts: sampling completions from the policy, and their per-token log-probabilities.

Sampling (LoRA applied, eval mode, no grad) is batched over prompts × completions, through Hone's static-cache
sampler (hone.core.speed.static_sampling: the decode step one CUDA graph on a GPU) or `transformers`' `generate`
(`grpo.sampler`). Its randomness is the torch RNG the trainer seeds from train.seed and every checkpoint saves, so
a resumed run samples the same completions. Log-probabilities go through the chunked head
(`logprobs.chunked_token_logprobs`) on the completion tokens only, with the logits divided by the sampling
temperature (as TRL scores them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from hone.core.models.head import HeadPlan, head_plan
from hone.core.speed.static_sampling import StaticSampler
from hone.core.train.loss import hidden_states
from hone.core.train.objectives.logprobs import chunked_token_logprobs


@dataclass
class Rollout:
    """B = prompts × G sampled sequences, each a left-padded prompt followed by a right-padded completion.

    Attributes:
        input_ids: (B, P + T) int64 prompt then completion ids.
        attention_mask: (B, P + T) int64, 0 on padding (and on completion tokens after the end of text).
        completion_ids: (B, T) int64.
        completion_mask: (B, T) fp32, 1 on completion tokens up to and including the first end-of-text token.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.completion_ids.shape[1]


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and mask of `prompts` padded on the left to the longest (what generation continues from)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def completion_mask(completion_ids: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """(B, T) fp32: 1 up to and including each row's first end-of-text token, 0 after."""
    is_eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= completion_ids == eos
    after = (is_eos.cumsum(1) - is_eos.long()) > 0  # strictly after the first end-of-text token
    return (~after).float()


def make_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor, eos_ids) -> Rollout:
    """A Rollout from left-padded prompts and the completions sampled for them (same row order)."""
    mask = completion_mask(completion_ids, set(eos_ids))
    return Rollout(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, mask.long()], dim=1),
        completion_ids=completion_ids,
        completion_mask=mask,
    )


@torch.no_grad()
def sample(
    model, prompts: list[list[int]], *, group: int, settings, pad_id: int, eos_ids, sampler: StaticSampler | None = None
) -> Rollout:
    """`group` completions of each prompt (rows p·G … p·G+G-1 for prompt p), sampled with `settings`' temperature,
    top_p and max_completion_length by `sampler` (None: `generate`), the model left in the mode it was in."""
    device = next(model.parameters()).device
    ids, mask = left_pad([p for p in prompts for _ in range(group)], pad_id, device)
    if sampler is not None:
        completions = sampler.sample(
            model,
            ids,
            mask,
            max_new_tokens=settings.max_completion_length,
            temperature=settings.temperature,
            top_p=settings.top_p,
            pad_id=pad_id,
            eos_ids=eos_ids,
        )
        return make_rollout(ids, mask, completions, eos_ids)
    was_training = model.training
    model.eval()
    try:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=0,  # only top_p filters, as the config says (transformers' default would add top_k = 50)
            max_new_tokens=settings.max_completion_length,
            pad_token_id=pad_id,
            eos_token_id=list(eos_ids),
        )
    finally:
        if was_training:
            model.train()
    completions = out[:, ids.shape[1] :]
    if completions.shape[1] == 0:  # every row ended at once: keep one (masked) position so shapes stay valid
        completions = torch.full((ids.shape[0], 1), pad_id, dtype=torch.long, device=device)
    return make_rollout(ids, mask, completions, eos_ids)


def _plan_at_temperature(model, temperature: float, mode: str) -> HeadPlan | None:
    """The chunked head plan with logits divided by `temperature`, or None to use the model's own forward."""
    plan = head_plan(model) if mode == "chunked" else None
    if not isinstance(plan, HeadPlan) or (plan.softcap is not None and temperature != 1.0):
        return None  # a soft-cap comes before the temperature: only the plain path keeps that order
    return dataclasses.replace(plan, scale=plan.scale / temperature)


def token_logprobs(model, rollout: Rollout, *, temperature: float = 1.0, mode: str = "chunked") -> torch.Tensor:
    """(B, T) fp32 log-probabilities of the completion tokens (0 where masked), differentiable when grad is on."""
    inputs = {
        "input_ids": rollout.input_ids,
        "attention_mask": rollout.attention_mask,
        "position_ids": (rollout.attention_mask.cumsum(1) - 1).clamp(min=0),
        "use_cache": False,
    }
    width, p = rollout.completion_ids.shape[1], rollout.prompt_width
    keep = rollout.completion_mask.flatten() > 0
    positions = torch.nonzero(keep).squeeze(1)
    targets = rollout.completion_ids.flatten().index_select(0, positions)
    plan = _plan_at_temperature(model, temperature, mode)
    if plan is not None:
        hidden = hidden_states(plan.body, inputs)[:, p - 1 : p - 1 + width].flatten(0, 1).index_select(0, positions)
        picked = chunked_token_logprobs(hidden, targets, plan)
    else:
        logits = model(**inputs).logits[:, p - 1 : p - 1 + width].flatten(0, 1).index_select(0, positions)
        picked = torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, targets[:, None]).squeeze(1)
    out = torch.zeros(keep.numel(), dtype=torch.float32, device=picked.device).index_put((positions,), picked)
    return out.view_as(rollout.completion_mask)

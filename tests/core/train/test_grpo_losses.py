"""GRPO's advantages, loss and gradients against TRL's GRPOTrainer on a tiny random-init model (float32)."""

from __future__ import annotations

import math

import pytest
import torch

from hone.core.train.objectives.grpo_losses import group_advantages, grpo_loss
from hone.core.train.objectives.grpo_rollout import left_pad, make_rollout, token_logprobs
from hone.core.train.objectives.preference import adapter_off

G, PROMPTS, PROMPT_LEN, MAX_LEN, TEMPERATURE = 3, 2, 5, 6, 0.7


def test_group_advantages_match_a_direct_computation():
    rewards = torch.tensor([1.0, 0.0, 2.0, 5.0, 5.0, 5.0, 0.5, float("nan"), 1.5])
    got = group_advantages(rewards, 3, "group")
    expected = []
    for group in ([1.0, 0.0, 2.0], [5.0, 5.0, 5.0], [0.5, 1.5]):
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        expected.append([(r - mean) / (std + 1e-4) for r in group])
    flat = expected[0] + expected[1] + [expected[2][0], 0.0, expected[2][1]]  # the NaN reward: advantage 0
    torch.testing.assert_close(got, torch.tensor(flat), rtol=1e-6, atol=1e-6)
    unscaled = group_advantages(rewards, 3, "none")
    torch.testing.assert_close(unscaled[:3], torch.tensor([0.0, -1.0, 1.0]))
    finite = rewards[~rewards.isnan()]
    batch = group_advantages(rewards, 3, "batch")
    torch.testing.assert_close(batch[3], (5.0 - 5.0) / (finite.std() + 1e-4))
    torch.testing.assert_close(batch[0], (1.0 - 1.0) / (finite.std() + 1e-4))
    torch.testing.assert_close(batch[2], (2.0 - 1.0) / (finite.std() + 1e-4))


@pytest.fixture
def tiny_policy():
    """A fresh LoRA model per test: TRL adds a "ref" adapter to the model it trains."""
    from peft import LoraConfig, get_peft_model

    from hone.core.models.shapes import build_model

    torch.manual_seed(0)
    model = build_model("tiny-dense", seed=0).float()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return get_peft_model(model, config)


def _trl_trainer(model, tokenizer, loss_type: str, beta: float, tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=G,
        per_device_train_batch_size=G * PROMPTS,
        max_completion_length=MAX_LEN,
        temperature=TEMPERATURE,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["a", "b"]}),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _grads(model) -> list[torch.Tensor]:
    grads = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_and_gradients_equal_trl(tiny_policy, smollm2_tokenizer, loss_type, tmp_path):
    model, eos = tiny_policy, smollm2_tokenizer.eos_token_id
    beta = 0.05
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(10, 4000, (PROMPTS, PROMPT_LEN), generator=gen).repeat_interleave(G, dim=0)
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(10, 4000, (PROMPTS * G, MAX_LEN), generator=gen)
    completion_ids[1, 2] = eos  # ends early: its last three tokens are masked out
    completion_ids[4, 4] = eos
    rollout = make_rollout(prompt_ids, prompt_mask, completion_ids, {eos})
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.5, -1.0])
    advantages = group_advantages(rewards, G, "group")
    model.train()
    with torch.no_grad(), adapter_off(model):
        ref = token_logprobs(model, rollout, temperature=TEMPERATURE)
    with torch.no_grad():
        current = token_logprobs(model, rollout, temperature=TEMPERATURE)
    # old log-probabilities off the current ones, so some ratios leave [1 - ε, 1 + ε_high] and are clipped
    old = current + 0.3 * torch.randn(current.shape, generator=gen)

    logps = token_logprobs(model, rollout, temperature=TEMPERATURE)
    ours = grpo_loss(
        logps,
        old,
        advantages,
        rollout.completion_mask,
        ref_logps=ref,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type=loss_type,
        max_completion_length=MAX_LEN,
    )
    ours.loss.backward()
    our_grads = _grads(model)
    assert 0 < float(ours.clip_fraction) < 1 and float(ours.kl) > 0

    trainer = _trl_trainer(model, smollm2_tokenizer, loss_type, beta, tmp_path)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": rollout.completion_mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": rollout.completion_mask.sum(),
    }
    model.train()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = _grads(model)

    torch.testing.assert_close(ours.loss.detach(), theirs.detach(), rtol=1e-4, atol=1e-7)
    assert len(our_grads) == len(their_grads) > 0
    for a, b in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in our_grads)


def test_clipping_stops_the_gradient_of_a_clipped_token():
    logps = torch.zeros(1, 2, requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # first token: ratio e ≈ 2.7 > 1 + ε_high with a positive advantage: clipped
    result = grpo_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 2), epsilon=0.2, epsilon_high=0.28)
    result.loss.backward()
    assert logps.grad[0, 0] == 0 and logps.grad[0, 1] == pytest.approx(-0.5)
    assert float(result.clip_fraction) == pytest.approx(0.5)


def test_chunked_log_probabilities_equal_the_models_own_forward(tiny_policy):
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, 4000, (n,), generator=gen).tolist() for n in (3, 7)]  # left padding on the first
    ids, mask = left_pad([p for p in prompts for _ in range(2)], 0, "cpu")
    completions = torch.randint(10, 4000, (4, 5), generator=gen)
    completions[2, 1] = 2  # an end-of-text token: the rest of that row is masked
    rollout = make_rollout(ids, mask, completions, {2})
    chunked = token_logprobs(tiny_policy, rollout, temperature=TEMPERATURE)
    plain = token_logprobs(tiny_policy, rollout, temperature=TEMPERATURE, mode="plain")
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    assert (chunked[2, 2:] == 0).all() and (chunked[2, :2] < 0).all()
    # a left-padded prompt scores as the same prompt alone
    alone = make_rollout(torch.tensor([prompts[0]]), torch.ones(1, 3, dtype=torch.long), completions[:1], {2})
    torch.testing.assert_close(
        token_logprobs(tiny_policy, alone, temperature=TEMPERATURE)[0], chunked[0], rtol=1e-4, atol=1e-5
    )

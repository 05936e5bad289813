"""KTO's reward margin on every step: the mean reward of the desirable answers minus that of the undesirable ones,
each from the latest step that had answers of that label (0 before the first: every reward is 0 while the adapter is
at zero). Packs group rows of like length, so a step's answers often all carry one label; the margin is still
defined, carried through a checkpoint's state, and equal to the step's own margin where the step has both labels."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import PreferenceConfig, RunConfig, SpeedConfig, TrainConfig
from hone.core.data.collate import IGNORE_INDEX, collate_packed
from hone.core.data.unpaired import LabeledRow
from hone.core.errors import HoneError
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.train.objectives import KahnemanTverskyOptimization

pytestmark = pytest.mark.core

BETA = 0.5
LORA = dict(r=4, lora_alpha=8, target_modules="all-linear")


def _model():
    """The tiny model with a random LoRA adapter (B too, so the policy differs from its reference)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_model("tiny-dense", seed=1), LoraConfig(**LORA))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def _rows(count: int, desirable: bool, seed: int) -> list[LabeledRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(count):
        prompt = torch.randint(3, 400, (3 + k,), generator=g).tolist()
        answer = torch.randint(3, 400, (2 + 2 * k,), generator=g).tolist()
        rows.append(
            LabeledRow(prompt + answer, [IGNORE_INDEX] * len(prompt) + answer, "rows.jsonl:1", desirable=desirable)
        )
    return rows


def _reference_reward(model, row: LabeledRow) -> float:
    """beta * (policy - reference) log-probability of the row's answer, from plain forwards of the whole row."""

    def answer_logp() -> float:
        logits = model(input_ids=torch.tensor([row.input_ids])).logits[0, :-1].float()
        targets = torch.tensor(row.labels[1:])
        scored = targets != IGNORE_INDEX
        return float(logits.log_softmax(-1)[scored].gather(1, targets[scored, None]).sum())

    with torch.no_grad():
        policy = answer_logp()
        with model.disable_adapter():
            reference = answer_logp()
    return BETA * (policy - reference)


def _mean_reward(model, rows: list[LabeledRow]) -> float:
    return sum(_reference_reward(model, r) for r in rows) / len(rows)


def _objective() -> KahnemanTverskyOptimization:
    return KahnemanTverskyOptimization(
        RunConfig(train=TrainConfig(method="kto"), preference=PreferenceConfig(beta=BETA))
    )


def _step(objective, model, micro_batches: list[list[LabeledRow]]) -> dict:
    with torch.no_grad():
        for rows in micro_batches:
            objective.loss_sum(model, collate_packed(rows))
    return objective.step_metrics()


def test_every_step_has_a_margin_from_the_latest_rewards_of_each_label():
    reference = _model()  # plain attention: the reference computation
    policy = _model()
    attention.configure(policy, SpeedConfig(attention="auto"), "cpu")  # Hone's packed attention, as a run has it
    good_1, bad_2, good_3, bad_3, good_4 = (
        _rows(3, True, 1), _rows(2, False, 2), _rows(2, True, 3), _rows(3, False, 4), _rows(1, True, 5),
    )  # fmt: skip
    good_1_mean, bad_2_mean = _mean_reward(reference, good_1), _mean_reward(reference, bad_2)
    good_3_mean, bad_3_mean = _mean_reward(reference, good_3), _mean_reward(reference, bad_3)
    good_4_mean = _mean_reward(reference, good_4)
    assert min(abs(good_1_mean), abs(bad_2_mean), abs(good_3_mean - bad_3_mean)) > 1e-3  # margins worth comparing

    objective = _objective()
    steps = [
        _step(objective, policy, [good_1]),  # desirable answers only: nothing undesirable seen yet counts as 0
        _step(objective, policy, [bad_2]),  # undesirable only: the desirable reward of step 1 stands
        _step(objective, policy, [good_3, bad_3]),  # both, in separate micro-batches: this step's own margin
    ]
    want = [good_1_mean, good_1_mean - bad_2_mean, good_3_mean - bad_3_mean]
    # A margin is a difference of rewards, each beta times a float32 sum of log-probabilities that the packed path
    # adds up in another order: the rounding is relative to those sums (3.5e-6 seen on one CPU), not to the margin.
    assert [s["reward_margin"] for s in steps] == pytest.approx(want, rel=1e-4, abs=2e-5)

    # a resumed run's objective takes the latest rewards from the checkpoint's state (a JSON object)
    saved = objective.checkpoint_state()
    resumed = _objective()
    resumed.load_checkpoint_state(saved)
    for which in (objective, resumed):
        step = _step(which, policy, [good_4])
        assert step["reward_margin"] == pytest.approx(good_4_mean - bad_3_mean, rel=1e-4, abs=2e-5)


def test_a_fresh_run_starts_from_zero_rewards_and_a_damaged_state_is_refused():
    objective = _objective()
    assert objective.checkpoint_state() == {"latest_rewards": [0.0, 0.0]}
    for damaged in ({"latest_rewards": ["high", None]}, {"latest_rewards": [1.0]}, {}):
        with pytest.raises(HoneError, match="latest_rewards"):
            objective.load_checkpoint_state(damaged)

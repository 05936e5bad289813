"""The trainer's loop takes its loss, normalization, data and extra metrics from the run's objective: a method
plugs in without a branch in the loop."""

from __future__ import annotations

import pytest

from hone.core import events
from hone.core.config import TRAINING_METHODS
from hone.core.errors import ConfigError
from hone.core.train.objectives import OBJECTIVES, SupervisedFineTuning, build_objective
from hone.core.train.trainer import Trainer


class TripledLoss(SupervisedFineTuning):
    """SFT's loss times three, normalized by every token of the batch instead of the trained ones."""

    def __init__(self, config):
        super().__init__(config)
        self.loaded = 0

    def load_data(self, config, tokenizer):
        self.loaded += 1
        return super().load_data(config, tokenizer)

    def loss_sum(self, model, batch, *, evaluating=False):
        return 3 * super().loss_sum(model, batch, evaluating=evaluating)

    def units(self, batch):
        return batch.num_tokens

    def row_units(self, dataset, rows):
        return int(sum(dataset.lengths[i] for i in rows))

    def step_metrics(self):
        return {"expert_load": [1, 2]}  # any StepMetrics field; a dense model's run has no expert meter of its own


def _steps(trainer) -> list[events.StepMetrics]:
    got = list(trainer.run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return [e for e in got if isinstance(e, events.StepMetrics)]


def test_the_loop_trains_on_what_the_objective_says(tiny_model_dir, chat_files, tiny_config, tmp_path):
    model = tiny_model_dir("tiny-dense")
    sft = _steps(Trainer(tiny_config(model, chat_files, tmp_path / "sft", "train.max_steps=2"), device="cpu"))
    config = tiny_config(model, chat_files, tmp_path / "tripled", "train.max_steps=2")
    objective = TripledLoss(config)
    custom = _steps(Trainer(config, device="cpu", objective=objective))

    assert objective.loaded == 1
    # Step 1 runs the base model (LoRA B starts at zero) on the same rows: the same sum, tripled, over all tokens.
    first, reference = custom[0], sft[0]
    assert first.tokens == reference.tokens and reference.trained_tokens < reference.tokens
    assert first.trained_tokens == reference.tokens  # the step reports the objective's units
    expected = 3 * reference.loss * reference.trained_tokens / reference.tokens
    assert first.loss == pytest.approx(expected, rel=1e-5)
    assert [s.expert_load for s in custom] == [[1, 2], [1, 2]]
    assert all(s.expert_load == [] for s in sft)


def test_methods_are_found_by_name():
    from hone.core.config import RunConfig

    assert isinstance(build_objective("sft", RunConfig()), SupervisedFineTuning)
    assert set(OBJECTIVES) == {"sft", "dpo", "simpo", "orpo", "kto", "grpo"} == set(TRAINING_METHODS)
    with pytest.raises(ConfigError) as error:
        build_objective("dpo-typo", RunConfig())
    assert "dpo-typo" in error.value.message and "sft" in error.value.advice

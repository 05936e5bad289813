"""Supervised fine-tuning: the summed next-token cross-entropy over the tokens a row trains (its labels)."""

from __future__ import annotations

from typing import ClassVar

from hone.core.config import RunConfig
from hone.core.data import TrainingData, load_training_data
from hone.core.train.loss import loss_sum


class SupervisedFineTuning:
    """SFT (`Objective`): rows rendered through the chat template, loss on the trained tokens only.

    Training steps take the fused cross-entropy kernel where `speed.kernels` allows it; evaluation always may (its
    result does not depend on the kernel).
    """

    name: ClassVar[str] = "sft"

    def __init__(self, config: RunConfig):
        self.loss_mode = config.speed.loss
        self.fused = config.speed.kernels
        self.seed = config.train.seed

    def load_data(self, config: RunConfig, tokenizer) -> TrainingData:
        return load_training_data(config.data, tokenizer, seed=self.seed)

    def loss_sum(self, model, batch, *, evaluating: bool = False):
        return loss_sum(model, batch, mode=self.loss_mode, fused=True if evaluating else self.fused)

    def units(self, batch) -> int:
        return batch.num_trained

    def row_units(self, dataset, rows: list[int]) -> int:
        return int(sum(dataset.trained_lengths[i] for i in rows))

    def step_metrics(self) -> dict:
        return {}

    def forget_step(self) -> None:  # nothing recorded per step
        return None

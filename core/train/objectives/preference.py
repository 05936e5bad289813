"""Preference optimization (DPO, SimPO, ORPO): a step's loss from pairs of a chosen and a rejected answer to one prompt.

A micro-batch holds whole pairs, each as two packed sequences (prompt + chosen, prompt + rejected; see
hone.core.data.preference). One forward gives every sequence's summed answer log-probability through the chunked
head (`logprobs.sequence_logprobs`); DPO's reference log-probabilities are those of the same weights with the adapter
switched off, so there is never a second copy of the model: computed once before step 1 and read by every step
(`preference.precompute_reference`, reference_logprobs.py), or by a second, gradient-free forward of each micro-batch.
The loss is summed over the pairs; the trainer divides by the step's pairs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

import torch

from hone.core.config import RunConfig
from hone.core.data.preference import PreferenceData, load_preference_data
from hone.core.errors import ConfigError
from hone.core.events import Notice
from hone.core.train.objectives.base import ObjectiveSetup
from hone.core.train.objectives.logprobs import sequence_logprobs
from hone.core.train.objectives.preference_losses import (
    OrpoLosses,
    PairLogprobs,
    PairLosses,
    dpo_losses,
    orpo_losses,
    simpo_losses,
)
from hone.core.train.objectives.reference_logprobs import PrecomputedReference


@contextlib.contextmanager
def adapter_off(model):
    """The base model: the same weights with the LoRA adapter switched off (peft's `disable_adapter`)."""
    disable = getattr(model, "disable_adapter", None)
    if disable is None:
        raise ConfigError(
            "preference training compares the fine-tune with the base model by switching the adapter off, and this "
            "model has no adapter",
            "train with LoRA (the [lora] settings)",
        )
    with disable():
        yield


class PreferenceOptimization:
    """A preference method (`Objective`) with the [preference] settings: the pairs' data, log-probabilities, loss and
    metrics. The subclasses below name the method."""

    name: ClassVar[str]
    uses_reference: ClassVar[bool]  # whether the loss compares with the base model (the adapter off)

    def __init__(self, config: RunConfig):
        self.settings = config.preference
        self.loss_mode = config.speed.loss
        self.seed = config.train.seed
        # running sums over a step's micro-batches, on the device: margin, correct rankings, chosen and rejected
        # log-probabilities, pairs; read once per step (`step_metrics`), after the step's own sync
        self._sums: torch.Tensor | None = None
        # the reference log-probabilities computed before step 1 (`prepare`), or None: each step computes them
        self.precomputed = (
            PrecomputedReference(self.reference_logprobs, "pairs")
            if self.uses_reference and self.settings.precompute_reference
            else None
        )

    def load_data(self, config: RunConfig, tokenizer) -> PreferenceData:
        if config.data.format != "auto":
            raise ConfigError(
                f"data.format = {config.data.format!r} is a format of supervised rows; preference rows are read by "
                "their prompt, chosen and rejected fields",
                'set data.format = "auto" (data.columns maps other column names)',
            )
        return load_preference_data(config.data, tokenizer, seed=self.seed)

    def prepare(self, setup: ObjectiveSetup) -> Iterator[Notice]:
        """Before step 1: the reference log-probabilities of the run's pairs, read from the data cache or computed
        once (`preference.precompute_reference`; nothing to do without a reference)."""
        if self.precomputed is not None:
            yield from self.precomputed.prepare(setup)

    def annotate(self, batch, dataset, rows: list[int]):
        """A micro-batch of `rows` of `dataset` with its precomputed reference log-probabilities, where known."""
        return batch if self.precomputed is None else self.precomputed.annotate(batch, dataset, rows)

    def reference_logprobs(self, model, batch) -> torch.Tensor:
        """(S,) fp32: each sequence's answer log-probability under the base model (the adapter off), no gradients."""
        with torch.no_grad(), adapter_off(model):
            return sequence_logprobs(model, batch, mode=self.loss_mode)[0]

    def pair_logprobs(self, model, batch) -> PairLogprobs:
        """Each pair's answer log-probabilities under the model (and the reference, for DPO: the batch's
        precomputed values where it carries them)."""
        ref = None
        if self.uses_reference:
            ref = getattr(batch, "reference", None)
            if ref is None:
                ref = self.reference_logprobs(model, batch)
        sums, counts = sequence_logprobs(model, batch, mode=self.loss_mode)
        return PairLogprobs(
            chosen=sums[0::2],
            rejected=sums[1::2],
            chosen_tokens=counts[0::2],
            rejected_tokens=counts[1::2],
            ref_chosen=None if ref is None else ref[0::2],
            ref_rejected=None if ref is None else ref[1::2],
        )

    def pair_losses(self, pairs: PairLogprobs) -> PairLosses:
        raise NotImplementedError

    def loss_sum(self, model, batch, *, evaluating: bool = False) -> torch.Tensor:
        pairs = self.pair_logprobs(model, batch)
        result = self.pair_losses(pairs)
        if not evaluating:
            self._record(pairs, result)
        return result.losses.sum()

    def _record(self, pairs: PairLogprobs, result: PairLosses) -> None:
        margin = result.chosen_rewards - result.rejected_rewards
        sums = torch.stack(
            [
                margin.sum(),
                (margin > 0).float().sum(),
                pairs.chosen.detach().sum(),
                pairs.rejected.detach().sum(),
                torch.tensor(float(margin.numel()), device=margin.device),
                *self.extra_sums(result),
            ]
        )
        self._sums = sums if self._sums is None else self._sums + sums

    def extra_sums(self, result: PairLosses) -> list[torch.Tensor]:
        """The method's own metrics of a micro-batch, as 0-d sums over its pairs (see `extra_metrics`)."""
        return []

    def extra_metrics(self, sums: list[float], pairs: float) -> dict:
        """The step's metrics from the sums of `extra_sums` over its micro-batches and its number of pairs."""
        return {}

    def units(self, batch) -> int:
        return len(batch.seq_lens) // 2

    def row_units(self, dataset, rows: list[int]) -> int:
        return len(rows)

    def forget_step(self) -> None:
        self._sums = None

    def step_metrics(self) -> dict:
        if self._sums is None:
            return {}
        margin, correct, chosen, rejected, pairs, *extra = (float(v) for v in self._sums.tolist())
        self._sums = None
        pairs = max(pairs, 1.0)
        return {
            "reward_margin": margin / pairs,
            "reward_accuracy": correct / pairs,
            "chosen_logps": chosen / pairs,
            "rejected_logps": rejected / pairs,
            **self.extra_metrics(extra, pairs),
        }


class DirectPreferenceOptimization(PreferenceOptimization):
    """DPO: the fine-tune's log-ratio against the base model on the chosen answer, minus that on the rejected one."""

    name: ClassVar[str] = "dpo"
    uses_reference: ClassVar[bool] = True

    def pair_losses(self, pairs: PairLogprobs) -> PairLosses:
        s = self.settings
        return dpo_losses(pairs, beta=s.beta, loss=s.loss, label_smoothing=s.label_smoothing)


class SimplePreferenceOptimization(PreferenceOptimization):
    """SimPO: per-token average log-probabilities of the two answers and a target margin; no reference model."""

    name: ClassVar[str] = "simpo"
    uses_reference: ClassVar[bool] = False

    def pair_losses(self, pairs: PairLogprobs) -> PairLosses:
        s = self.settings
        return simpo_losses(pairs, beta=s.beta, gamma=s.simpo_gamma, label_smoothing=s.label_smoothing)


class OddsRatioPreferenceOptimization(PreferenceOptimization):
    """ORPO: the chosen answer's NLL plus lambda times the odds-ratio loss of the two answers; no reference model."""

    name: ClassVar[str] = "orpo"
    uses_reference: ClassVar[bool] = False

    def pair_losses(self, pairs: PairLogprobs) -> PairLosses:
        return orpo_losses(pairs, lam=self.settings.orpo_lambda)

    def extra_sums(self, result: PairLosses) -> list[torch.Tensor]:
        assert isinstance(result, OrpoLosses) and result.nll is not None and result.log_odds is not None
        return [result.nll * result.log_odds.numel(), result.log_odds.sum()]  # the NLL is the micro-batch's mean

    def extra_metrics(self, sums: list[float], pairs: float) -> dict:
        nll, log_odds = sums
        return {"nll": nll / pairs, "log_odds_ratio": log_odds / pairs}

"""Held-out preference accuracy: how often the base model and the fine-tune rank the chosen answer above the rejected.

Each held-out pair's two answers are scored by their log-probability after the prompt, under the fine-tune and under
the base (the same weights, the adapter switched off), packed a few pairs at a time through the chunked head. A model
ranks a pair right when the chosen answer has the higher mean log-probability per token (per token, so that a longer
answer is not ranked lower for its length alone). The fine-tune's implicit reward, DPO's view, is also counted: its
log-probability gain over the base on the chosen answer against that on the rejected one. `hone eval` prints both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from hone.core.data.preference import PairSet, load_preference_data
from hone.core.errors import DataError
from hone.core.inference.chat import ChatModels

# Pairs scored per forward: enough to keep a GPU busy on short rows, few enough for a laptop's memory.
PAIRS_PER_BATCH = 8


@dataclass(frozen=True)
class PreferenceScores:
    """Per model (base, fine-tune): pairs ranked right and the mean margin, chosen minus rejected, of the answers'
    per-token mean log-probabilities; and the pairs whose chosen answer the fine-tune gained more on than the
    rejected one (summed log-probabilities, against the base: DPO's implicit reward)."""

    pairs: int
    base_right: int
    tuned_right: int
    base_margin: float
    tuned_margin: float
    reward_right: int

    def accuracy(self, tuned: bool) -> float:
        return (self.tuned_right if tuned else self.base_right) / max(self.pairs, 1)


def held_out_pairs(config, tokenizer, data: str | None = None) -> PairSet:
    """The pairs to score: those of `data` when given, else the run's evaluation pairs (data.eval, or the pairs
    data.eval_fraction held out, with the run's seed).

    Raises:
        DataError: the run has no held-out pairs and no file was given, or none is usable.
    """
    cfg = config.data
    if data is not None:
        return load_preference_data(replace(cfg, train=[str(data)], eval=[], eval_fraction=0.0), tokenizer).train
    if not cfg.eval and cfg.eval_fraction <= 0:
        raise DataError(
            "the run has no held-out pairs (data.eval is empty and data.eval_fraction is 0)",
            "give a file of pairs with --data FILE",
        )
    held = load_preference_data(cfg, tokenizer, seed=config.train.seed).eval
    if held is None:
        raise DataError("the run's data holds too few pairs to hold any out", "give a file of pairs with --data FILE")
    return held


def score_pairs(
    models: ChatModels, pairs: PairSet, *, limit: int | None = None, progress: Callable[[int, int], None] | None = None
) -> PreferenceScores:
    """Rank the first `limit` pairs (None: all) with the fine-tune and the base."""
    import torch  # with the models: this module is imported light, for the CLI and the Studio

    with torch.no_grad():
        return _score(models, pairs, len(pairs) if limit is None else min(limit, len(pairs)), progress)


def _score(models: ChatModels, pairs: PairSet, count: int, progress) -> PreferenceScores:
    from hone.core.data.collate import collate_packed
    from hone.core.train.objectives.logprobs import sequence_logprobs
    from hone.core.train.objectives.preference import adapter_off

    if not models.has_adapter:
        raise DataError("comparing the fine-tune with its base needs the run's adapter", "train the run first")
    device = next(models.model.parameters()).device
    right = {True: 0, False: 0}
    margin = {True: 0.0, False: 0.0}
    reward_right = 0
    for start in range(0, count, PAIRS_PER_BATCH):
        rows = [pairs[i] for i in range(start, min(start + PAIRS_PER_BATCH, count))]
        batch = collate_packed([s for row in rows for s in row.sequences]).to(device)
        tuned_sums, tokens = sequence_logprobs(models.model, batch)
        with adapter_off(models.model):
            base_sums, _ = sequence_logprobs(models.model, batch)
        for tuned, sums in ((True, tuned_sums), (False, base_sums)):
            means = (sums / tokens.clamp(min=1)).float().cpu()
            gap = means[0::2] - means[1::2]
            right[tuned] += int((gap > 0).sum())
            margin[tuned] += float(gap.sum())
        gain = (tuned_sums - base_sums).float().cpu()
        reward_right += int((gain[0::2] > gain[1::2]).sum())
        if progress is not None:
            progress(min(start + PAIRS_PER_BATCH, count), count)
    n = max(count, 1)
    return PreferenceScores(count, right[False], right[True], margin[False] / n, margin[True] / n, reward_right)

"""`hone demo --method dpo` (or simpo, orpo, kto): preference training of the bundled SmolLM2-135M-Instruct on the
bundled pairs (preference_data.py), with held-out preference accuracy before and after.

A model ranks a held-out pair right when the chosen answer has the higher mean log-probability per token after the
prompt, the rule `hone eval` ranks pairs by (hone.core.inference.preference_eval); the margin is the mean over the
pairs of that per-token gap, chosen minus rejected. The base model is scored before training, the fine-tune after.
`rank_pairs` repeats the few lines of that rule for one model: hone.core.demo and hone.core.inference sit side by side
in core's folder order and may not import each other (a test checks that both give the same numbers).
KTO reads the same file: each pair becomes a desirable and an undesirable answer (hone.core.data.unpaired).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.demo.before_after import ScorePhase, SilentPhase, base_demo_config, train_and_rescore
from hone.core.errors import ConfigError

# The methods the demo trains with: every preference method of train.method (GRPO needs rewards, not pairs).
DEMO_METHODS = ("dpo", "simpo", "orpo", "kto")
# Where the generated pairs are kept, under Hone's cache folder (a file is rewritten when the generator's output
# differs from it).
DATA_FOLDER = ("demo", "preference-json-v1")
# Pairs scored per forward: a few, so a laptop's memory holds the activations of one batch easily.
PAIRS_PER_BATCH = 8
# Overrides of the SFT demo's config (resources/configs/demo.toml) for a preference run on two CPU cores.
PREFERENCE_SETTINGS = (
    # The pairs' rows are about 100 tokens (the longest, a JSON answer over several lines, under 140); two rows of
    # max_length must fit one micro-batch of train.batch_tokens (1024).
    "data.max_length=256",
    # The demo scores its held-out pairs itself, before and after; an end-of-run evaluation loss over them would
    # cost another two forwards of every held-out pair, for a number the table does not show.
    "data.eval=[]",
    "data.eval_fraction=0.0",
    # An epoch of the bundled pairs is about 8 steps: a shorter warm-up than the SFT demo's 3 of its about 35.
    "train.warmup_steps=2",
)
# Per method: SimPO compares length-normalized log-probabilities, whose gaps are a few hundredths of a nat, so it
# takes the beta of the SimPO paper (2.0) where DPO and KTO keep 0.1; ORPO is scaled by orpo_lambda (its default).
METHOD_SETTINGS = {"dpo": (), "simpo": ("preference.beta=2.0",), "orpo": (), "kto": ()}


def preference_data_files() -> tuple[Path, Path]:
    """The bundled pairs (train.jsonl, eval.jsonl), written into the cache on first use."""
    from hone.core.demo.preference_data import write_preference_dataset
    from hone.core.resources import writable_cache

    return write_preference_dataset(writable_cache(*DATA_FOLDER))


def check_method(method: str) -> None:
    """Raises ConfigError, saying which methods the demo runs, when `method` is not one of them."""
    if method not in DEMO_METHODS:
        raise ConfigError(
            f"the demo does not train with method {method!r}",
            f"use --method {', '.join(('sft', *DEMO_METHODS, 'grpo'))} (sft is the JSON demo without pairs, grpo "
            "learns from rewards)",
        )


def preference_demo_config(
    method: str, runs_dir: str | None = None, steps: int | None = None, model: str | None = None
) -> RunConfig:
    """The SFT demo's config turned into a `method` run on the bundled pairs (written into the cache if missing)."""
    check_method(method)
    train, _ = preference_data_files()
    overrides = [
        f"train.method={json.dumps(method)}",
        f"data.train=[{json.dumps(str(train))}]",
        *PREFERENCE_SETTINGS,
        *METHOD_SETTINGS[method],
    ]
    return base_demo_config(runs_dir, steps, model).with_overrides(overrides)


@dataclass(frozen=True)
class PreferenceScore:
    """One model on the held-out pairs: pairs ranked right (chosen above rejected) and the mean margin, chosen minus
    rejected, of the answers' mean log-probabilities per token (nats)."""

    right: int
    total: int
    margin: float

    @property
    def rate(self) -> float:
        return self.right / max(self.total, 1)


@dataclass(frozen=True)
class PreferenceDemoResult:
    before: PreferenceScore
    after: PreferenceScore
    held_out: str
    run_dir: str
    adapter_dir: str


def rank_pairs(model, pairs, progress: Callable[[int, int], None] | None = None) -> PreferenceScore:
    """Rank each pair of `pairs` (a PairSet) with `model`, PAIRS_PER_BATCH pairs packed per forward."""
    import torch

    from hone.core.data.collate import collate_packed
    from hone.core.train.objectives.logprobs import sequence_logprobs

    device = next(model.parameters()).device
    right, margin = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(pairs), PAIRS_PER_BATCH):
            rows = [pairs[i] for i in range(start, min(start + PAIRS_PER_BATCH, len(pairs)))]
            batch = collate_packed([s for row in rows for s in row.sequences]).to(device)
            sums, tokens = sequence_logprobs(model, batch)  # (2 * pairs,) fp32: chosen, rejected, chosen, ...
            means = (sums / tokens.clamp(min=1)).float().cpu()
            gap = means[0::2] - means[1::2]
            right += int((gap > 0).sum())
            margin += float(gap.sum())
            if progress is not None:
                progress(start + len(rows), len(pairs))
    return PreferenceScore(right, len(pairs), margin / max(len(pairs), 1))


def held_out_pair_set(config: RunConfig, tokenizer, held_out: Path, limit: int | None = None):
    """The first `limit` (None: all) pairs of `held_out`, tokenized as the run's data settings say."""
    from hone.core.data.preference import load_preference_data

    cfg = replace(config.data, train=[str(held_out)], eval=[], eval_fraction=0.0)
    pairs = load_preference_data(cfg, tokenizer).train
    return pairs if limit is None else pairs.subset(range(min(limit, len(pairs))))


def run_preference_demo(
    config: RunConfig,
    *,
    eval_rows: int | None = None,
    on_stage: Callable[[str], None] | None = None,
    phase: ScorePhase | None = None,
) -> Generator[object, None, PreferenceDemoResult | None]:
    """Rank the held-out pairs with the base model, train, rank them with the fine-tune. Yields the run's events; its
    return value is the PreferenceDemoResult, or None when training failed. The held-out pairs are data.eval's first
    file when the config names one, else the bundled ones; `eval_rows` keeps their first N."""
    from hone.core.models.load import load_model

    check_method(config.train.method)
    stage = on_stage or (lambda text: None)
    phase = phase or SilentPhase
    held_out = Path(config.data.eval[0]) if config.data.eval else preference_data_files()[1]

    def score(model, who: str) -> PreferenceScore:
        with phase(f"ranking {len(pairs)} held-out pairs with {who}", len(pairs)) as p:
            return rank_pairs(model, pairs, progress=lambda done, total: p.update(done))

    stage("loading the base model")
    loaded = load_model(config.model, for_training=False)
    pairs = held_out_pair_set(config, loaded.tokenizer, held_out, eval_rows)
    before = score(loaded.model, "the base model")
    stage(f"base model: {before.right}/{before.total} pairs ranked right")
    trained = yield from train_and_rescore(
        config, loaded.model, lambda tuned: score(tuned, "the fine-tuned model"), stage
    )
    if trained is None:
        return None
    final, after = trained
    return PreferenceDemoResult(before, after, str(held_out), final.run_dir, final.adapter_dir)

"""`hone demo --method grpo`: reinforcement learning of the bundled SmolLM2-135M-Instruct on the bundled prompts
(grpo_data.py: add two numbers, reply with one line of JSON), with the held-out reward before and after.

Both scorings sample the same way: `grpo.num_generations` replies to every held-out prompt, drawn as training draws
them (grpo_rollout.sample: the run's temperature, top-p and completion length) from one fixed seed, and scored by
the run's own rewards. The numbers are the mean reward and the share of replies scoring the full reward (right form
and right sum). The torch random state of the caller is left as it was.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.demo.before_after import ScorePhase, SilentPhase, base_demo_config, train_and_rescore

# Where the generated prompts are kept, under Hone's cache folder (rewritten when the generator's output differs).
DATA_FOLDER = ("demo", "grpo-sum-json-v1")
# The seed both scorings sample from, so base and fine-tune answer the same draws of the random stream.
SCORE_SEED = 1234
# Prompts per generation batch when scoring: 8 prompts x 4 replies, a batch two CPU cores generate in a few seconds.
PROMPTS_PER_BATCH = 8
# Overrides of the SFT demo's config (resources/configs/demo.toml) for a GRPO run on two CPU cores.
GRPO_SETTINGS = (
    # The demo scores its held-out prompts itself, before and after; GRPO runs do not evaluate a loss.
    "data.eval=[]",
    "data.eval_fraction=0.0",
    # The prompts are about 50 tokens with their system turn.
    "data.max_length=128",
    # 4 replies per prompt: the least that leaves a group a spread of rewards to learn from at this model's hit
    # rate, and what two CPU cores sample quickly. A right reply is 8 tokens with its end; 16 leave room for a short
    # preamble, and a reply cut off at 16 tokens is no JSON line (reward for the form 0), which teaches brevity.
    "grpo.num_generations=4",
    "grpo.max_completion_length=16",
    # At 1.0 this model's samples are mostly off-topic text; 0.7 keeps them on the question, so a group holds a
    # right reply often enough to learn from.
    "grpo.temperature=0.7",
    # 4 x (about 50 + 16) tokens a prompt: 2 prompts (8 replies) per step, so the 36 prompts make 18 steps.
    "train.batch_tokens=640",
    "train.warmup_steps=2",
    # Enough to learn the form within 18 steps of 8 replies. At the SFT demo's 1e-3 the replies collapsed onto the
    # form with fewer right sums (held-out fully right 9 % -> 14 %, against 9 % -> 25 % at 3e-4).
    "train.lr=3e-4",
)


def grpo_data_files() -> tuple[Path, Path]:
    """The bundled prompts (train.jsonl, eval.jsonl), written into the cache on first use."""
    from hone.core.demo.grpo_data import write_grpo_dataset
    from hone.core.resources import writable_cache

    return write_grpo_dataset(writable_cache(*DATA_FOLDER))


def grpo_demo_config(runs_dir: str | None = None, steps: int | None = None, model: str | None = None) -> RunConfig:
    """The SFT demo's config turned into a GRPO run on the bundled prompts (written into the cache if missing)."""
    from hone.core.demo.grpo_data import GRPO_REWARDS

    train, _ = grpo_data_files()
    data = base_demo_config(runs_dir, steps, model).to_dict()
    data["train"]["method"] = "grpo"
    data["data"]["train"] = [str(train)]
    data["grpo"]["rewards"] = [dict(spec) for spec in GRPO_REWARDS]
    # The rewards are tables, which `with_overrides` does not spell; the rest are plain overrides.
    return RunConfig.from_dict(data, source="the GRPO demo").with_overrides(list(GRPO_SETTINGS))


@dataclass(frozen=True)
class RewardScore:
    """One model's sampled replies to the held-out prompts: their mean reward, how many scored the full reward
    (`right` of `total`), each reward's mean by name, and the first few (prompt, reply, reward)."""

    mean: float
    right: int
    total: int
    by_reward: dict[str, float]
    examples: list[tuple[str, str, float]]

    @property
    def rate(self) -> float:
        return self.right / max(self.total, 1)


@dataclass(frozen=True)
class GrpoDemoResult:
    before: RewardScore
    after: RewardScore
    step_rewards: list[float]  # the training reward's mean per step, in order (NaN where every reward failed)
    held_out: str
    run_dir: str
    adapter_dir: str


def held_out_prompts(config: RunConfig, tokenizer, held_out: Path, limit: int | None = None) -> list:
    """The first `limit` (None: all) prompts of `held_out` as PromptRows, tokenized as training tokenizes them."""
    from hone.core.data.prompts import load_prompt_data

    cfg = replace(config.data, train=[str(held_out)], eval=[], eval_fraction=0.0)
    s = config.grpo
    rows = load_prompt_data(cfg, tokenizer, group=s.num_generations, max_completion=s.max_completion_length).train
    return list(rows)[:limit]


def score_replies(model, tokenizer, prompts: list, config: RunConfig, progress=None) -> RewardScore:
    """Sample `grpo.num_generations` replies to each of `prompts` (PromptRows) from SCORE_SEED, as training samples
    them, and score them with the run's rewards."""
    import torch

    from hone.core.train.objectives.grpo_rollout import sample
    from hone.core.train.rewards import Sample, build_rewards, score_samples

    s = config.grpo
    rewards = build_rewards(s.rewards, s.reward_file)
    full = sum(r.weight for r in rewards)
    eos = tokenizer.eos_token_id
    eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    totals: list[float] = []
    by_reward: dict[str, list[float]] = {r.name: [] for r in rewards}
    examples: list[tuple[str, str, float]] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(SCORE_SEED)
        for start in range(0, len(prompts), PROMPTS_PER_BATCH):
            rows = prompts[start : start + PROMPTS_PER_BATCH]
            rollout = sample(
                model, [r.input_ids for r in rows], group=s.num_generations, settings=s, pad_id=pad, eos_ids=eos_ids
            )
            lengths = rollout.completion_mask.sum(1).long().tolist()
            ids = rollout.completion_ids.tolist()
            texts = tokenizer.batch_decode([x[:n] for x, n in zip(ids, lengths)], skip_special_tokens=True)
            samples = [
                Sample(t, rows[i // s.num_generations].text, rows[i // s.num_generations].columns, n)
                for i, (t, n) in enumerate(zip(texts, lengths))
            ]
            scores = score_samples(rewards, samples)
            totals += scores.total
            for name, values in scores.by_reward.items():
                by_reward[name] += values
            examples += [
                (rows[i // s.num_generations].columns.get("prompt", ""), t, r)
                for i, (t, r) in enumerate(zip(texts, scores.total))
                if i % s.num_generations == 0
            ]
            if progress is not None:
                progress(start + len(rows), len(prompts))
    scored = [t for t in totals if not math.isnan(t)]
    return RewardScore(
        mean=_mean(totals),
        right=sum(t >= full - 1e-9 for t in scored),
        total=len(totals),
        by_reward={name: _mean(values) for name, values in by_reward.items()},
        examples=[(_question(p), t, r) for p, t, r in examples[:3]],
    )


def _mean(values: list[float]) -> float:
    """The mean of the values a reward scored (NaN: it failed on that reply); NaN when it scored none."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _question(prompt) -> str:
    """The user's question of a prompt column (text, or messages ending on the user's turn)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def run_grpo_demo(
    config: RunConfig,
    *,
    eval_rows: int | None = None,
    on_stage: Callable[[str], None] | None = None,
    phase: ScorePhase | None = None,
) -> Generator[object, None, GrpoDemoResult | None]:
    """Score the base model's replies to the held-out prompts, train with GRPO, score the fine-tune's. Yields the
    run's events; its return value is the GrpoDemoResult, or None when training failed. The held-out prompts are
    data.eval's first file when the config names one, else the bundled ones; `eval_rows` keeps their first N."""
    from hone.core.events import StepMetrics
    from hone.core.models.load import load_model

    stage = on_stage or (lambda text: None)
    phase = phase or SilentPhase
    held_out = Path(config.data.eval[0]) if config.data.eval else grpo_data_files()[1]
    if config.data.eval:  # the held-out file is the demo's to score, not the trainer's to read
        config = replace(config, data=replace(config.data, eval=[]))

    def score(model, who: str) -> RewardScore:
        with phase(f"sampling replies to {len(prompts)} held-out prompts with {who}", len(prompts)) as p:
            return score_replies(model, tokenizer, prompts, config, progress=lambda done, total: p.update(done))

    stage("loading the base model")
    loaded = load_model(config.model, for_training=False)
    tokenizer = getattr(loaded.tokenizer, "tokenizer", loaded.tokenizer)
    prompts = held_out_prompts(config, tokenizer, held_out, eval_rows)
    before = score(loaded.model, "the base model")
    stage(f"base model: mean reward {before.mean:.2f}, {before.right}/{before.total} replies fully right")
    step_rewards: list[float] = []

    trained = None
    run = train_and_rescore(config, loaded.model, lambda tuned: score(tuned, "the fine-tuned model"), stage)
    try:
        while True:
            event = next(run)
            if isinstance(event, StepMetrics):
                step_rewards.append(math.nan if event.reward_mean is None else event.reward_mean)
            yield event
    except StopIteration as done:
        trained = done.value
    if trained is None:
        return None
    final, after = trained
    return GrpoDemoResult(before, after, step_rewards, str(held_out), final.run_dir, final.adapter_dir)

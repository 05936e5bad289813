"""GRPO (`Objective`): reinforcement learning from verifiable rewards on answers the policy samples itself.

A micro-batch is a few prompts (hone.core.data.prompts). For each, `grpo.num_generations` answers are sampled from
the policy (LoRA on; `grpo_rollout.sample`), scored by the run's rewards (hone.core.train.rewards), and compared
within their group (`grpo_losses.group_advantages`); the loss is the clipped surrogate, plus β times the KL against
the base model (the adapter off) when β > 0, with gradients through the chunked per-token log-probabilities.

With grpo.num_iterations = 1 (the default) each step samples its own answers, so the "old" log-probabilities are the
current ones detached (the ratio is 1 and clipping only shapes the gradient). Above 1, the answers of a cycle's first
step are kept, with those log-probabilities as the old ones, for the cycle's later steps over the same prompts
(grpo_reuse.py): their ratio leaves 1 and clipping bounds the update, as TRL's num_iterations. The trainer
divides the summed loss by the step's answers: each micro-batch contributes its own normalized loss × its answers,
which is TRL's loss exactly for one micro-batch per step (dapo's token mean is then per micro-batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from hone.core.config import RunConfig
from hone.core.data.prompts import PromptData, PromptRow, load_prompt_data
from hone.core.speed.static_sampling import StaticSampler, Unsupported, layout
from hone.core.train.objectives.grpo_losses import group_advantages, grpo_loss
from hone.core.train.objectives.grpo_reuse import KeptAnswers
from hone.core.train.objectives.grpo_rollout import Rollout, sample, token_logprobs
from hone.core.train.objectives.preference import adapter_off
from hone.core.train.rewards import Sample, build_rewards, score_samples

SAMPLE_CHARS = 300  # an answer's characters kept in a step line's samples (its prompt: a third of that)


@dataclass
class PromptBatch:
    """A micro-batch of prompts; it stays on the host (generation moves the ids)."""

    rows: list[PromptRow]
    num_tokens: int
    indices: list[int] | None = None  # the rows' indices in the data (`annotate`); None for a stand-in batch

    def to(self, device) -> PromptBatch:
        return self


class StepRecord:
    """What a step's micro-batches add to its metrics, read once by `step_metrics`."""

    def __init__(self, names: list[str]):
        self.rewards: list[float] = []
        self.by_reward: dict[str, list[float]] = {name: [] for name in names}
        self.lengths: list[float] = []
        self.kl_tokens = 0.0
        self.clipped_tokens = 0.0
        self.tokens = 0.0
        self.problems: list[str] = []
        self.failed = 0
        self.best: tuple[float, str] | None = None  # (reward, "reward R · prompt → answer") of the step's best answer
        self.worst: tuple[float, str] | None = None

    def keep_samples(self, samples: list[Sample], totals: list[float]) -> None:
        """Remember the best- and the worst-rewarded answer seen in the step (answers a reward failed on left out)."""
        scored = [(r, s) for r, s in zip(totals, samples) if not math.isnan(r)]
        if not scored:
            return
        reward, sample = max(scored, key=lambda item: item[0])
        if self.best is None or reward > self.best[0]:
            self.best = (reward, sample_line(reward, sample))
        reward, sample = min(scored, key=lambda item: item[0])
        if self.worst is None or reward < self.worst[0]:
            self.worst = (reward, sample_line(reward, sample))

    def sample_lines(self) -> list[str]:
        lines = [held[1] for held in (self.best, self.worst) if held is not None]
        return lines[:1] if len(lines) == 2 and lines[0] == lines[1] else lines


def sample_line(reward: float, sample: Sample) -> str:
    """ "reward R · PROMPT → ANSWER", each part cut to its share of SAMPLE_CHARS, whitespace runs as one space."""

    def cut(text: str, limit: int) -> str:
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    return f"reward {reward:.3g} · {cut(sample.prompt, SAMPLE_CHARS // 3)} → {cut(sample.completion, SAMPLE_CHARS)}"


class GroupRelativePolicyOptimization:
    """GRPO with the [grpo] settings: prompts in, sampled answers scored, the group-relative clipped loss out."""

    name: ClassVar[str] = "grpo"

    def __init__(self, config: RunConfig):
        self.settings = config.grpo
        self.loss_mode = config.speed.loss
        self.seed = config.train.seed
        self.rewards = build_rewards(config.grpo.rewards, config.grpo.reward_file)
        self.tokenizer = None
        self._record = StepRecord([r.name for r in self.rewards])
        self._sampler: StaticSampler | None = None
        self._sampling: str | None = None  # how answers are sampled, once chosen
        self._note = None  # the run's notice callback, for a capture that fails mid-run
        # optimizer steps per batch of answers: the stream repeats each step's prompts as often (PackStream)
        self.updates_per_batch = config.grpo.num_iterations
        self._kept = KeptAnswers(self.updates_per_batch)

    def choose_sampler(self, model, note=None) -> str:
        """Pick how answers are sampled: the static-cache sampler where `grpo.sampler` asks for it (auto: on a GPU)
        and the model's attention takes its masks, else `generate`. Returns the choice in words (a speed path)."""
        self._note = note
        choice = self.settings.sampler
        on_gpu = next(model.parameters()).device.type == "cuda"
        self._sampling = "transformers' generate" + (" (auto on a CPU)" if choice == "auto" else "")
        if choice == "static" or (choice == "auto" and on_gpu):
            try:
                layout(model)
            except Unsupported as why:
                self._sampling = f"transformers' generate ({why})"
            else:
                self._sampler = StaticSampler()
                self._sampling = "static KV cache" + (", decode step as one CUDA graph" if on_gpu else "")
        return self._sampling

    def _sample(self, model, prompts: list[list[int]]) -> Rollout:
        if self._sampling is None:
            self.choose_sampler(model)
        s, sampler = self.settings, self._sampler
        pad, eos_ids = self._token_ids()
        known = sampler.capture_problem if sampler is not None else None
        rollout = sample(
            model, prompts, group=s.num_generations, settings=s, pad_id=pad, eos_ids=eos_ids, sampler=sampler
        )
        if sampler is not None and sampler.capture_problem != known and self._note is not None:
            self._note(
                "sampling",
                f"the decode step could not run as a CUDA graph ({sampler.capture_problem}): it runs step by step",
                "warning",
            )
        return rollout

    def load_data(self, config: RunConfig, tokenizer) -> PromptData:
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        s = self.settings
        return load_prompt_data(config.data, tokenizer, group=s.num_generations, max_completion=s.max_completion_length)

    def collate(self, rows: list[PromptRow]) -> PromptBatch:
        """The micro-batch of `rows` (StepRunner takes an objective's own collation where it has one)."""
        s = self.settings
        return PromptBatch(rows, sum(s.num_generations * (len(r.input_ids) + s.max_completion_length) for r in rows))

    def _token_ids(self) -> tuple[int, list[int]]:
        tok = self.tokenizer
        eos = tok.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
        return pad, eos_ids

    def annotate(self, batch: PromptBatch, dataset, rows: list[int]) -> PromptBatch:
        """The micro-batch with its rows' indices in the data: the key its answers are kept by."""
        batch.indices = list(rows)
        return batch

    def begin_step(self, step: int) -> None:
        """Enter 0-based `step`: a cycle's first step samples anew, its later ones reuse the kept answers."""
        self._kept.begin_step(step)

    def _record_kept(self, rows) -> None:
        """A reused micro-batch's rewards and answer lengths, recorded for the step's metrics as when sampled."""
        record = self._record
        for row in rows:
            record.rewards += [r for r in row.rewards.tolist() if not math.isnan(r)]
            for name, values in row.by_reward.items():
                record.by_reward.setdefault(name, [])
                record.by_reward[name] += [v for v in values.tolist() if not math.isnan(v)]
            record.lengths += row.completion_mask.sum(1).tolist()

    def _score(self, batch: PromptBatch, rollout: Rollout, per_answer: dict | None = None) -> torch.Tensor:
        """(B,) fp32 rewards of the sampled answers (NaN where a reward failed), recorded for the metrics;
        `per_answer` (a dict) receives the (B,) float64 totals ("total") and each reward's values (by its name)."""
        group = self.settings.num_generations
        lengths = rollout.completion_mask.sum(1).long().tolist()
        ids = rollout.completion_ids.tolist()
        texts = self.tokenizer.batch_decode([row[:n] for row, n in zip(ids, lengths)], skip_special_tokens=True)
        samples = [
            Sample(text, batch.rows[i // group].text, batch.rows[i // group].columns, n, batch.rows[i // group].source)
            for i, (text, n) in enumerate(zip(texts, lengths, strict=True))
        ]
        scores = score_samples(self.rewards, samples)
        record = self._record
        record.rewards += [r for r in scores.total if not math.isnan(r)]
        for name, values in scores.by_reward.items():
            record.by_reward[name] += [v for v in values if not math.isnan(v)]
        record.lengths += [float(n) for n in lengths]
        record.problems += scores.problems[: max(0, 5 - len(record.problems))]
        record.failed += scores.failed
        record.keep_samples(samples, scores.total)
        if per_answer is not None:  # float64, as the metrics sum them: a reused step reports the very same numbers
            per_answer["total"] = torch.tensor(scores.total, dtype=torch.float64)
            per_answer.update({k: torch.tensor(v, dtype=torch.float64) for k, v in scores.by_reward.items()})
        return torch.tensor(scores.total, dtype=torch.float32)

    def loss_sum(self, model, batch: PromptBatch, *, evaluating: bool = False) -> torch.Tensor:
        s = self.settings
        keep = self.updates_per_batch > 1 and not evaluating and batch.indices is not None
        # answers of these rows kept this cycle (a later step of it, or the same step run again on smaller
        # micro-batches after running out of memory): trained on again; else sampled now and kept
        if keep and self._kept.has(batch.indices):
            pad, _ = self._token_ids()
            reused = self._kept.reuse(batch.indices, pad, next(model.parameters()).device)
            self._record_kept(reused.rows)
            rollout, advantages, ref = reused.rollout, reused.advantages, reused.ref
            logps = token_logprobs(model, rollout, temperature=s.temperature, mode=self.loss_mode)
            old = reused.old.to(logps.device)
        else:
            rollout = self._sample(model, [row.input_ids for row in batch.rows])
            values: dict[str, torch.Tensor] = {}
            rewards = self._score(batch, rollout, values)
            advantages = group_advantages(rewards, s.num_generations, s.scale_rewards)
            ref = None
            if s.beta != 0.0:
                with torch.no_grad(), adapter_off(model):
                    ref = token_logprobs(model, rollout, temperature=s.temperature, mode=self.loss_mode)
            logps = token_logprobs(model, rollout, temperature=s.temperature, mode=self.loss_mode)
            old = logps.detach()  # the policy that sampled them: no update since (the cycle's first step)
            if keep:
                self._kept.keep(
                    batch.indices,
                    s.num_generations,
                    [row.input_ids for row in batch.rows],
                    rollout,
                    old=old,
                    ref=ref,
                    advantages=advantages,
                    rewards=values.pop("total"),
                    by_reward=values,
                )
        mask = rollout.completion_mask
        result = grpo_loss(
            logps,
            old,
            advantages.to(logps.device),
            mask,
            ref_logps=ref,
            beta=s.beta,
            epsilon=s.epsilon,
            epsilon_high=s.epsilon_high or None,
            loss_type=s.loss_type,
            max_completion_length=s.max_completion_length,
            kl_bias_correction=s.kl_bias_correction,
        )
        tokens = float(mask.sum())
        self._record.tokens += tokens
        self._record.kl_tokens += float(result.kl) * tokens
        self._record.clipped_tokens += float(result.clip_fraction) * tokens
        return result.loss * mask.shape[0]

    def checkpoint_tensors(self) -> dict | None:
        """What a checkpoint keeps: the answers kept for the rest of the cycle (None with one update per batch)."""
        return self._kept.to_state() if self.updates_per_batch > 1 else None

    def load_checkpoint_tensors(self, state: dict) -> None:
        """Take up `checkpoint_tensors()`'s state from a checkpoint (HoneError: a damaged one)."""
        if self.updates_per_batch > 1:
            self._kept.from_state(state)

    def units(self, batch: PromptBatch) -> int:
        return len(batch.rows) * self.settings.num_generations

    def row_units(self, dataset, rows: list[int]) -> int:
        return len(rows) * self.settings.num_generations

    def forget_step(self) -> None:
        self._record = StepRecord([r.name for r in self.rewards])

    def step_metrics(self) -> dict:
        record, self._record = self._record, StepRecord([r.name for r in self.rewards])
        if not record.lengths:
            return {}
        rewards = torch.tensor(record.rewards, dtype=torch.float64)
        return {
            "reward_mean": float(rewards.mean()) if len(rewards) else None,  # None: every reward failed
            "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "rewards": {name: sum(v) / len(v) for name, v in record.by_reward.items() if v},
            "completion_length": sum(record.lengths) / len(record.lengths),
            "kl": record.kl_tokens / max(record.tokens, 1.0),
            "clip_fraction": record.clipped_tokens / max(record.tokens, 1.0),
            "samples": record.sample_lines(),
            "reward_problems": record.problems
            + (
                [f"... and {record.failed - len(record.problems)} more"] if record.failed > len(record.problems) else []
            ),
        }

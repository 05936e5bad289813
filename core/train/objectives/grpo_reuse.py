"""GRPO's answers kept for the later optimizer steps of their cycle (grpo.num_iterations > 1).

With μ = num_iterations, the stream gives each step's prompts μ times in a row (hone.core.train.step.PackStream), so
steps kμ … kμ + μ - 1 form a cycle over the same rows. The first step of a cycle samples and scores the answers; its
log-probabilities (detached: the policy that sampled them, before any update) become the "old" ones the later steps'
ratio and clipping compare with, as TRL's num_iterations does. Each prompt row's answers are kept by its index in the
data, so a step that runs again on smaller micro-batches (out of memory) finds them whatever rows go together.

A checkpoint in the middle of a cycle keeps them (`to_state` / `from_state`: tensors and numbers, in the
checkpoint's training state), so a resumed run trains its later steps on the same answers, bit for bit. With several
processes each keeps the rows of its own share and only the first process writes the checkpoint: the others sample
again, after a resume inside a cycle, the rows they lack.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hone.core.errors import HoneError
from hone.core.train.objectives.grpo_rollout import Rollout, left_pad


@dataclass
class KeptRow:
    """One prompt row's G answers as its cycle's first step left them.

    Attributes:
        prompt: the prompt's token ids.
        completion_ids: (G, T) int64, right-padded.
        completion_mask: (G, T) fp32.
        old: (G, T) fp32 per-token log-probabilities under the policy that sampled them.
        ref: (G, T) fp32 under the base model (β > 0), or None.
        advantages: (G,) fp32.
        rewards: (G,) float64 totals (NaN where a reward failed), as the step's metrics sum them.
        by_reward: each named reward's (G,) float64 values.
    """

    prompt: list[int]
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    old: torch.Tensor
    ref: torch.Tensor | None
    advantages: torch.Tensor
    rewards: torch.Tensor
    by_reward: dict[str, torch.Tensor]


@dataclass
class Reused:
    """A micro-batch put together from kept rows, in the batch's row order."""

    rollout: Rollout
    old: torch.Tensor
    ref: torch.Tensor | None
    advantages: torch.Tensor
    rows: list[KeptRow]


class KeptAnswers:
    """The current cycle's kept rows, by row index; emptied when a new cycle begins."""

    def __init__(self, iterations: int):
        self.iterations = iterations
        self.cycle = -1
        self.rows: dict[int, KeptRow] = {}

    def begin_step(self, step: int) -> None:
        """Enter 0-based `step`: the rows of an earlier cycle are dropped when it starts a new one."""
        cycle = step // self.iterations
        if cycle != self.cycle:
            self.cycle, self.rows = cycle, {}

    def has(self, indices: list[int] | None) -> bool:
        return indices is not None and all(i in self.rows for i in indices)

    def keep(self, indices: list[int], group: int, prompts: list[list[int]], rollout: Rollout, **per_answer) -> None:
        """Keep each row's slice of a sampled micro-batch (`per_answer`: old, ref, advantages, rewards: (B, …)
        tensors, or None; by_reward: {name: (B,)})."""
        width = rollout.completion_ids.shape[1]
        for r, index in enumerate(indices):
            part = slice(r * group, (r + 1) * group)

            def cut(t, part=part, dtype=torch.float32):
                return None if t is None else t[part].detach().to("cpu", dtype).clone()

            self.rows[index] = KeptRow(
                prompt=list(prompts[r]),
                completion_ids=rollout.completion_ids[part].detach().cpu().clone(),
                completion_mask=rollout.completion_mask[part, :width].detach().cpu().float().clone(),
                old=cut(per_answer["old"]),
                ref=cut(per_answer.get("ref")),
                advantages=cut(per_answer["advantages"]),
                rewards=cut(per_answer["rewards"], dtype=torch.float64),
                by_reward={k: cut(v, dtype=torch.float64) for k, v in per_answer["by_reward"].items()},
            )

    def reuse(self, indices: list[int], pad_id: int, device) -> Reused:
        """The micro-batch of rows `indices` from what was kept: prompts left-padded and answers right-padded to
        the widest, as sampling lays them out."""
        rows = [self.rows[i] for i in indices]
        group = rows[0].completion_ids.shape[0]
        prompts = [r.prompt for r in rows for _ in range(group)]
        prompt_ids, prompt_mask = left_pad(prompts, pad_id, device)
        width = max(r.completion_ids.shape[1] for r in rows)

        def stack(name: str, fill) -> torch.Tensor:
            parts = []
            for r in rows:
                t = getattr(r, name)
                parts.append(torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill))
            return torch.cat(parts).to(device)

        ids, mask = stack("completion_ids", pad_id), stack("completion_mask", 0.0)
        rollout = Rollout(
            input_ids=torch.cat([prompt_ids, ids], dim=1),
            attention_mask=torch.cat([prompt_mask, mask.long()], dim=1),
            completion_ids=ids,
            completion_mask=mask,
        )
        ref = stack("ref", 0.0) if rows[0].ref is not None else None
        advantages = torch.cat([r.advantages for r in rows]).to(device)
        return Reused(rollout, stack("old", 0.0), ref, advantages, rows)

    # ---- checkpoints ----
    def to_state(self) -> dict:
        """What a checkpoint keeps: the cycle and its rows, as tensors and plain values."""
        rows = {}
        for index, r in self.rows.items():
            rows[str(index)] = {
                "prompt": torch.tensor(r.prompt, dtype=torch.long),
                "completion_ids": r.completion_ids,
                "completion_mask": r.completion_mask,
                "old": r.old,
                "advantages": r.advantages,
                "rewards": r.rewards,
                "by_reward": dict(r.by_reward),
                **({"ref": r.ref} if r.ref is not None else {}),
            }
        return {"cycle": self.cycle, "rows": rows}

    def from_state(self, state: dict) -> None:
        """Take up `to_state()`'s state from a checkpoint.

        Raises:
            HoneError: the state is not one `to_state` writes (a damaged checkpoint).
        """
        try:
            cycle, rows = int(state["cycle"]), state["rows"]
            kept = {}
            for key, r in rows.items():
                ids = r["completion_ids"]
                shape = tuple(ids.shape)
                tensors = [r["completion_mask"], r["old"], *([r["ref"]] if "ref" in r else [])]
                if len(shape) != 2 or any(tuple(t.shape) != shape for t in tensors):
                    raise ValueError(f"row {key}'s answers and log-probabilities differ in shape")
                if any(tuple(t.shape) != shape[:1] for t in (r["advantages"], r["rewards"], *r["by_reward"].values())):
                    raise ValueError(f"row {key} holds rewards for another number of answers")
                kept[int(key)] = KeptRow(
                    prompt=[int(t) for t in r["prompt"].tolist()],
                    completion_ids=ids.long(),
                    completion_mask=r["completion_mask"].float(),
                    old=r["old"].float(),
                    ref=r["ref"].float() if "ref" in r else None,
                    advantages=r["advantages"].float(),
                    rewards=r["rewards"].double(),
                    by_reward={str(k): v.double() for k, v in r["by_reward"].items()},
                )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise HoneError(
                f"the checkpoint's GRPO answers cannot be read ({type(e).__name__}: {str(e)[:200]})",
                "resume from another checkpoint of the run (its folder's checkpoints/), or start the run again",
            ) from None
        self.cycle, self.rows = cycle, kept

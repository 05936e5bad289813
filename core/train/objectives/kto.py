"""KTO (Kahneman-Tversky optimization): a step's loss from single answers labelled desirable or undesirable.

A micro-batch holds whole rows (prompt + answer, the answer scored; hone.core.data.unpaired), each with its label
in the batch (`desirable`). The policy's answer log-probabilities come from one forward through the chunked head;
the reference's are those of the same weights with the adapter off: computed once before step 1
(`preference.precompute_reference`, reference_logprobs.py), or by a gradient-free forward of each micro-batch.

KTO's reference point, an estimate of KL(policy ‖ reference), comes from mismatched sequences built from the same
micro-batch: row i's prompt followed by row i-1's answer (cyclically, as TRL's KTOTrainer rotates the completions of
its batch), scored by the policy and the reference without gradients in every micro-batch (which answer follows which
prompt depends on how the rows are grouped, and that changes from epoch to epoch, so these are never computed ahead);
its mean log-ratio, clamped at 0, is the same for every row. Building them reads the batch's tokens back to the host
once per micro-batch (a few KB). The loss is summed over the rows; the trainer divides by the step's rows.

A step's `reward_margin` is the mean reward of its desirable answers minus the mean reward of its undesirable ones
(TRL's rewards/margins). Packs group rows of like length, so all the answers of a step may carry one label: the
margin then takes the other label's mean from the latest step that had answers of it, and 0 before the first (every
reward is 0 while the adapter is at zero: the fine-tune is its own reference). Those latest means are the objective's
state (`checkpoint_state`), saved with a checkpoint, so a resumed run reports the margins an unbroken one does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from hone.core.config import RunConfig
from hone.core.data.collate import IGNORE_INDEX, PackedBatch, collate_packed, collate_padded
from hone.core.data.tokenized import TokenizedRow
from hone.core.data.unpaired import UnpairedData, load_unpaired_data
from hone.core.errors import ConfigError, DataError, HoneError
from hone.core.events import Notice
from hone.core.train.objectives.base import ObjectiveSetup
from hone.core.train.objectives.logprobs import sequence_logprobs
from hone.core.train.objectives.preference import adapter_off
from hone.core.train.objectives.preference_losses import KtoLosses, kto_losses
from hone.core.train.objectives.reference_logprobs import PrecomputedReference


@dataclass
class _Split:
    """One sequence of a batch, split where its answer starts: token ids, the answer's labels as a TokenizedRow has
    them, and each part's flat positions in the batch (where its embedding rows are)."""

    prompt: list[int]
    prompt_positions: list[int]
    answer: list[int]
    answer_labels: list[int]
    answer_positions: list[int]


def _split_rows(batch) -> list[_Split]:
    """Every sequence of `batch` split into its prompt (the tokens before its first scored one) and its answer (the
    rest), read on the host."""
    ids = batch.input_ids.flatten().tolist()
    targets = batch.targets.flatten().tolist()
    packed = isinstance(batch, PackedBatch)
    starts = list(itertools.accumulate(batch.seq_lens, initial=0)) if packed else None
    out = []
    for index, length in enumerate(batch.seq_lens):
        start = starts[index] if starts is not None else index * batch.input_ids.shape[1]
        seq_ids, seq_targets = ids[start : start + length], targets[start : start + length]
        # targets[t] scores token t + 1: the answer starts at the first scored token
        first = next((t + 1 for t, target in enumerate(seq_targets) if target != IGNORE_INDEX), length)
        labels = [seq_ids[t] if seq_targets[t - 1] != IGNORE_INDEX else IGNORE_INDEX for t in range(first, length)]
        positions = list(range(start, start + length))
        out.append(_Split(seq_ids[:first], positions[:first], seq_ids[first:], labels, positions[first:]))
    return out


def mismatched_batch(batch, max_length: int):
    """The KL sequences of `batch` (a PackedBatch or PaddedBatch), in a batch of the same kind on its device:
    sequence i is row i's prompt followed by row i-1's answer (row 0 takes the last row's), cut to `max_length`
    tokens. Embedding rows a host table gathered (`input_rows`) are taken from the batch's own."""
    split = _split_rows(batch)
    rows, sources = [], []
    for i, row in enumerate(split):
        other = split[i - 1]
        ids = (row.prompt + other.answer)[:max_length]
        labels = ([IGNORE_INDEX] * len(row.prompt) + other.answer_labels)[:max_length]
        rows.append(TokenizedRow(ids, labels, ""))
        sources.append((row.prompt_positions + other.answer_positions)[:max_length])
    if isinstance(batch, PackedBatch):
        kl = collate_packed(rows)
        flat = [p for positions in sources for p in positions]
    else:
        kl = collate_padded(rows, pad_id=0)
        width = kl.input_ids.shape[1]
        flat = [p for positions in sources for p in positions + [0] * (width - len(positions))]
    device = batch.input_ids.device
    kl = kl.to(device)
    if batch.input_rows is not None:
        index = torch.tensor(flat, dtype=torch.int64, device=device)
        gathered = batch.input_rows.flatten(0, 1).index_select(0, index)
        kl.input_rows = gathered.view(*kl.input_ids.shape, gathered.shape[-1])
    return kl


class KahnemanTverskyOptimization:
    """KTO (`Objective`) with the [preference] settings beta, desirable_weight and undesirable_weight."""

    name: ClassVar[str] = "kto"
    uses_reference: ClassVar[bool] = True  # the loss compares with the base model (the adapter off)

    def __init__(self, config: RunConfig):
        self.settings = config.preference
        self.loss_mode = config.speed.loss
        self.seed = config.train.seed
        self.max_length = config.data.max_length
        # running sums over a step's micro-batches, on the device (see `_record`); read once per step
        self._sums: torch.Tensor | None = None
        # mean reward of the desirable and of the undesirable answers of the latest step that had any (see the
        # module's docstring): the margin of a step whose answers all carry one label
        self._latest_rewards = [0.0, 0.0]
        # the rows' reference log-probabilities computed before step 1 (`prepare`), or None: each step computes them
        self.precomputed = (
            PrecomputedReference(self.reference_logprobs, "rows") if self.settings.precompute_reference else None
        )

    def load_data(self, config: RunConfig, tokenizer) -> UnpairedData:
        if config.data.format != "auto":
            raise ConfigError(
                f"data.format = {config.data.format!r} is a format of supervised rows; KTO rows are read by their "
                "prompt, completion and label fields",
                'set data.format = "auto" (data.columns maps other column names)',
            )
        weights = (self.settings.desirable_weight, self.settings.undesirable_weight)
        return load_unpaired_data(config.data, tokenizer, seed=self.seed, weights=weights)

    def prepare(self, setup: ObjectiveSetup) -> Iterator[Notice]:
        """Before step 1: the rows' reference log-probabilities, read from the data cache or computed once
        (`preference.precompute_reference`); the KL reference point stays per micro-batch (see the module)."""
        if self.precomputed is not None:
            yield from self.precomputed.prepare(setup)

    def annotate(self, batch, dataset, rows: list[int]):
        """A micro-batch of `rows` of `dataset` with its precomputed reference log-probabilities, where known."""
        return batch if self.precomputed is None else self.precomputed.annotate(batch, dataset, rows)

    def reference_logprobs(self, model, batch) -> torch.Tensor:
        """(N,) fp32: each row's answer log-probability under the base model (the adapter off), no gradients."""
        with torch.no_grad(), adapter_off(model):
            return sequence_logprobs(model, batch, mode=self.loss_mode)[0]

    def losses(self, model, batch) -> tuple[KtoLosses, torch.Tensor, torch.Tensor]:
        """The rows' losses, their labels ((N,) bool) and the policy's answer log-probabilities ((N,) fp32)."""
        if batch.desirable is None:
            raise DataError("a KTO batch has rows without a desirable label", "load the data with the KTO objective")
        kl_batch = mismatched_batch(batch, self.max_length)
        ref_logps = getattr(batch, "reference", None)  # precomputed before step 1, where the batch carries them
        with torch.no_grad():
            kl_logps, _ = sequence_logprobs(model, kl_batch, mode=self.loss_mode)
            with adapter_off(model):
                if ref_logps is None:
                    ref_logps, _ = sequence_logprobs(model, batch, mode=self.loss_mode)
                ref_kl_logps, _ = sequence_logprobs(model, kl_batch, mode=self.loss_mode)
        logps, _ = sequence_logprobs(model, batch, mode=self.loss_mode)
        s = self.settings
        result = kto_losses(
            logps, ref_logps, batch.desirable, kl_logps, ref_kl_logps, beta=s.beta,
            desirable_weight=s.desirable_weight, undesirable_weight=s.undesirable_weight,
        )  # fmt: skip
        return result, batch.desirable, logps

    def loss_sum(self, model, batch, *, evaluating: bool = False) -> torch.Tensor:
        result, desirable, logps = self.losses(model, batch)
        if not evaluating:
            self._record(result, desirable, logps.detach())
        return result.losses.sum()

    def _record(self, result: KtoLosses, desirable: torch.Tensor, logps: torch.Tensor) -> None:
        good = desirable.float()
        bad = 1 - good
        rewards = result.rewards
        # an answer is ranked right when its reward has its label's sign
        right = torch.where(desirable, rewards > 0, rewards < 0).float()
        sums = torch.stack(
            [
                (rewards * good).sum(),
                good.sum(),
                (rewards * bad).sum(),
                bad.sum(),
                right.sum(),
                (logps * good).sum(),
                (logps * bad).sum(),
                result.kl,
                torch.ones((), device=rewards.device),
            ]
        )
        self._sums = sums if self._sums is None else self._sums + sums

    def units(self, batch) -> int:
        return len(batch.seq_lens)

    def row_units(self, dataset, rows: list[int]) -> int:
        return len(rows)

    def forget_step(self) -> None:
        self._sums = None

    def step_metrics(self) -> dict:
        if self._sums is None:
            return {}
        values = (float(v) for v in self._sums.tolist())
        good_reward, good, bad_reward, bad, right, good_logps, bad_logps, kl, batches = values
        self._sums = None
        out = {"reward_accuracy": right / max(good + bad, 1.0), "kl": kl / max(batches, 1.0)}
        if good:
            out["chosen_logps"] = good_logps / good
            self._latest_rewards[0] = good_reward / good
        if bad:
            out["rejected_logps"] = bad_logps / bad
            self._latest_rewards[1] = bad_reward / bad
        out["reward_margin"] = self._latest_rewards[0] - self._latest_rewards[1]
        return out

    def checkpoint_state(self) -> dict:
        """What a checkpoint keeps of this objective (JSON): the latest mean rewards the margin reads."""
        return {"latest_rewards": list(self._latest_rewards)}

    def load_checkpoint_state(self, state: dict) -> None:
        """Take up `checkpoint_state()`'s state from a checkpoint.

        Raises:
            HoneError: `state` does not hold two numbers as latest_rewards (a damaged checkpoint).
        """
        rewards = state.get("latest_rewards") if isinstance(state, dict) else None
        if (
            not isinstance(rewards, list)
            or len(rewards) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rewards)
        ):
            raise HoneError(
                f"the checkpoint's KTO state holds latest_rewards = {rewards!r}, not two numbers",
                "resume from another checkpoint of the run (its folder's checkpoints/), or start the run again",
            )
        self._latest_rewards = [float(v) for v in rewards]

"""Measured preflight: before step 1, one forward and backward on the largest micro-batch the run will see.

Its peak memory (plus the optimizer state the first step will allocate) is measured against the memory the run may
use. A run that would not fit is re-planned once: each pack runs as more micro-batches (the same rows per step, so
the loss curve stays comparable), and that is measured again. The cost is at most two micro-batches' forward and
backward, less than two steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from hone.core import events
from hone.core.data.tokenized import TokenizedRow
from hone.core.memory.estimate import GIB
from hone.core.train.step import split_packs

# Room kept beyond the measured peak: the caching allocator's reserved-but-unused blocks, which a hard limit counts
# and torch's allocated peak does not (under an 8 GiB cap a step measured at 6.5 GiB allocated could still fail:
# docs/performance/memory-planner.md).
ALLOCATOR_MARGIN = 0.05


class CudaMeter:
    """Peak allocated bytes on the current CUDA device around a piece of work."""

    def start(self) -> float:
        """Bytes allocated now; the peak counter starts again from here."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what a failed trial or the loading left cached must not count against the run
        torch.cuda.reset_peak_memory_stats()
        return float(torch.cuda.memory_allocated())

    def peak(self) -> float:
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated())


@dataclass(frozen=True)
class Trial:
    """One measured micro-batch: its tokens, the bytes allocated before it, its peak (None: out of memory)."""

    tokens: int
    resident: float
    peak: float | None

    def transient(self) -> float | None:
        return None if self.peak is None else self.peak - self.resident


@dataclass(frozen=True)
class PreflightResult:
    split: int  # micro-batches each pack runs as from step 1
    trials: tuple[Trial, ...]
    pending: float  # optimizer state the first step allocates, bytes
    available: float
    fits: bool
    gave_up: str = ""  # what the re-plan gave up before splitting the packs (the layers that kept activations)

    def need(self) -> float | None:
        """Measured bytes of the last trial with the optimizer state to come and the allocator's margin."""
        last = self.trials[-1]
        return None if last.peak is None else (last.peak + self.pending) * (1 + ALLOCATOR_MARGIN)


def largest_micro_batch(dataset, packs: list[list[int]], packing: bool) -> list[TokenizedRow]:
    """Rows standing in for the largest micro-batch the run will see: copies of its longest row filling its fullest
    pack (the last copy cut to the tokens left, unless the row holds images), or that row alone without packing."""
    lengths = dataset.lengths
    index = int(max(range(len(lengths)), key=lambda i: int(lengths[i])))
    longest = dataset[index]
    if not packing:
        return [longest]
    tokens = max(sum(int(lengths[i]) for i in pack) for pack in packs)
    size = int(lengths[index])  # what packing counts: a pair's two answers, a GRPO prompt's whole group
    rows = [longest] * max(tokens // size, 1)
    rest = tokens - size * len(rows)
    # only a plain text row is cut: a pair's answers and a prompt's group go whole, an image's tokens too
    if rest > 0 and isinstance(longest, TokenizedRow) and not longest.images:
        rows.append(replace(longest, input_ids=longest.input_ids[:rest], labels=longest.labels[:rest]))
    return rows


def pending_optimizer_bytes(optimizer) -> float:
    """Bytes of optimizer state not allocated yet: torch's AdamW (two float32 moments) and bitsandbytes' 8-bit
    AdamW (two 8-bit moments for tensors of 4,096 values or more) make it at the first step; FlatAdamW up front."""
    if getattr(optimizer, "flat_params", None) is not None:
        return 0.0
    eight_bit = "8bit" in type(optimizer).__name__
    total = 0.0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p not in optimizer.state:
                total += p.numel() * (2 if eight_bit and p.numel() >= 4096 else 8)
    return total


def split_for(trial: Trial, pending: float, available: float, split: int) -> int:
    """The micro-batch split (a power of two above `split`) whose transient, taken as proportional to the
    micro-batch's tokens, fits beside what stays allocated; twice `split` when the trial ran out of memory."""
    transient = trial.transient()
    room = available / (1 + ALLOCATOR_MARGIN) - trial.resident - pending
    if transient is None or room <= 0:
        return split * 2
    return split * 2 ** max(1, math.ceil(math.log2(transient / room)))


def run_preflight(
    step_loop, rows: list[TokenizedRow], *, available: float, split: int, meter, give_up=None
) -> PreflightResult:
    """Measure the largest micro-batch of `rows` split `split` ways; if it does not fit `available` bytes, re-plan
    once and measure again: first by `give_up()` where given and it frees something (it returns what, in words, or
    "": the layers that keep their activations are recomputed again, which costs less than smaller micro-batches),
    else by splitting each pack."""
    pending = pending_optimizer_bytes(step_loop.optimizer)
    lengths = [len(r.input_ids) for r in rows]
    trials: list[Trial] = []
    gave_up = ""
    for attempt in range(2):
        pieces = split_packs([list(range(len(rows)))], lengths, split)
        piece = max(pieces, key=lambda p: sum(lengths[i] for i in p))
        resident = meter.start()
        try:
            step_loop.trial_backward([rows[i] for i in piece])
            peak = meter.peak()
        except torch.OutOfMemoryError:
            step_loop.forget_step()
            peak = None
        trials.append(Trial(sum(lengths[i] for i in piece), resident, peak))
        result = PreflightResult(split, tuple(trials), pending, available, fits=False, gave_up=gave_up)
        need = result.need()
        if need is not None and need <= available:
            return replace(result, fits=True)
        if attempt == 0 and give_up is not None and (gave_up := give_up()):
            continue
        if attempt == 0 and len(piece) > 1:
            split = split_for(trials[-1], pending, available, split)
        else:
            break
    return result


def preflight_notice(result: PreflightResult, predicted: float | None, first_split: int) -> events.Notice:
    """What the preflight measured and decided, in words; a re-plan carries step 0 (the memory chart marks it)."""
    first, last = result.trials[0], result.trials[-1]

    def measured(trial: Trial) -> str:
        if trial.peak is None:
            return f"a micro-batch of {trial.tokens:,} tokens ran out of memory"
        need = (trial.peak + result.pending) * (1 + ALLOCATOR_MARGIN)
        return f"a micro-batch of {trial.tokens:,} tokens needs {need / GIB:.1f} GiB"

    said = (
        f"measured before step 1: {measured(first)}"
        + (f" (predicted ≈ {predicted / GIB:.1f} GiB)" if predicted else "")
        + f" of {result.available / GIB:.1f} GiB"
    )
    if result.gave_up:
        outcome = f"measured again, {measured(last)}" + ("" if result.fits else ", which may still not fit")
        return events.Notice(
            topic="memory", level="warning", step=0, message=f"{said}: {result.gave_up} from step 1; {outcome}"
        )
    if result.split == first_split:
        if result.fits:
            return events.Notice(topic="memory", message=f"{said}: it fits")
        return events.Notice(
            topic="memory",
            level="warning",
            message=(
                f"{said}; it may not fit, and a step that runs out of memory is run again on smaller micro-batches"
            ),
        )
    outcome = f"measured again, {measured(last)}" + ("" if result.fits else ", which may still not fit")
    return events.Notice(
        topic="memory",
        level="warning",
        step=0,
        message=(
            f"{said}: each pack runs as {result.split} micro-batches from step 1 (the same rows per step); {outcome}"
        ),
    )

"""A resumed run's length, place in the data and optimizer settings: the steps in all from where the run is, where
an epoch begins, the learning-rate schedule laid out anew from the next step, and clipping and weight decay changed on
the restored optimizer.
"""

from __future__ import annotations

import math

from hone.core.config import RunConfig
from hone.core.train.resume_rules import toml_value

_SCHEDULE_KEYS = ("lr", "schedule", "warmup_steps", "warmup_ratio", "max_steps", "epochs")


def total_steps_from(config: RunConfig, stream, step: int, position: int) -> int:
    """The run's length in optimizer steps when it is at `step` with `position` packs consumed: train.max_steps, or
    the step plus the steps that finish `train.epochs` epochs of the data from `position` (a fresh run's count
    whenever position = step * grad_accum, as it is unless the data changed)."""
    t = config.train
    if t.max_steps:
        return t.max_steps
    full, fraction = int(t.epochs), t.epochs - int(t.epochs)
    packs = sum(len(stream.plan(e)) for e in range(full)) + math.ceil(fraction * len(stream.plan(full)))
    remaining = math.ceil((packs - position) / t.grad_accum)
    return max(1, remaining) if step == 0 else step + max(0, remaining)


def epoch_start(stream, epoch: int) -> int:
    """The position (packs consumed) where `epoch` begins."""
    return sum(len(stream.plan(e)) for e in range(epoch))


def retarget_schedule(
    optimizer, scheduler, before, after, before_total: int, after_total: int, step: int
) -> str | None:
    """Lay the learning-rate schedule out anew from 0-based step `step` when the peak, shape, warmup or length
    differ (TrainConfigs `before` as trained, `after` as given now); returns what changed, or None.

    The restored LambdaLR keeps the old peak in `base_lrs` and the optimizer the old step's lr: both are set to the
    new schedule, so the next step already runs on it.
    """
    from hone.core.train.optim import lr_factor

    changed = [
        f"train.{k} {toml_value(getattr(before, k))} → {toml_value(getattr(after, k))}"
        for k in _SCHEDULE_KEYS
        if getattr(before, k) != getattr(after, k)
    ]
    if not changed and before_total == after_total:
        return None

    def factor(s: int) -> float:
        return lr_factor(s, after, after_total)

    old_lr = before.lr * lr_factor(step, before, before_total)
    scheduler.base_lrs = [after.lr for _ in optimizer.param_groups]
    scheduler.lr_lambdas = [factor for _ in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["initial_lr"] = after.lr
        group["lr"] = after.lr * factor(step)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # what get_last_lr() reports
    length = (
        f"steps in all {before_total} → {after_total}" if before_total != after_total else f"{after_total} steps in all"
    )
    return (
        f"the learning-rate schedule is laid out anew from step {step + 1}: {', '.join([*changed, length])}; "
        f"step {step + 1} runs at lr {optimizer.param_groups[0]['lr']:.3g} where the schedule so far had "
        f"{old_lr:.3g}"
    )


def apply_update_settings(optimizer, before, after) -> list[str]:
    """Set clipping and weight decay that differ from the checkpoint's (TrainConfigs) on the restored optimizer;
    what changed, in words. Clipping is read from the config at every step, so only weight decay is set here."""
    said = []
    if before.weight_decay != after.weight_decay:
        for group in optimizer.param_groups:
            group["weight_decay"] = after.weight_decay
        said.append(
            f"train.weight_decay {toml_value(before.weight_decay)} → {toml_value(after.weight_decay)}: AdamW weight "
            "decay from the next step"
        )
    if before.max_grad_norm != after.max_grad_norm:
        said.append(
            f"train.max_grad_norm {toml_value(before.max_grad_norm)} → {toml_value(after.max_grad_norm)}: gradient "
            "clipping from the next step"
        )
    return said

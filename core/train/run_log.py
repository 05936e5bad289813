"""What train.log says, in plain lines: one per event, a step's line with its loss, speed, memory and time left.

`RunWriter` (run_dir.py) writes these lines; the console of `hone train` prints the same step lines.
"""

from __future__ import annotations

import math

from hone.core import events


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def step_line(event: events.StepMetrics, first_step: int = 0) -> str:
    """One plain line for a step: step, loss, tokens/s, memory, time left (from the pace since `first_step`)."""
    line = (
        f"step {event.step}/{event.total_steps}  loss {event.loss:.4f}  lr {event.lr:.2e}  "
        f"{event.tokens_per_s:,.0f} tok/s"
    )
    if event.mem_allocated:
        line += f"  {event.mem_allocated / 2**30:.1f} GiB"
    if event.waiting_for_data:
        line += f"  waiting for data {event.waiting_for_data:.0%}"
    done = event.step - first_step
    if done > 0 and event.step < event.total_steps:
        line += f"  ETA {_eta(event.elapsed / done * (event.total_steps - event.step))}"
    return line


def speed_choice(device: str, choice: str) -> str:
    """A speed path's choice as the user reads it: a GPU-only path on a CPU run is plainly "off (CPU)"."""
    if not str(device).startswith("cuda") and "only on a GPU" in choice:
        return "off (CPU)"
    return choice


def log_lines(event: events.Event) -> list[str]:
    """What train.log says about one event (step lines are throttled by RunWriter)."""
    if isinstance(event, events.DatasetReport):
        skipped = sum(event.skipped.values())
        reasons = ", ".join(f"{count} {reason}" for reason, count in event.skipped.items())
        lines = [
            f"{event.split} data {', '.join(event.files)}: {event.rows_read:,} rows read, {event.rows_kept:,} "
            f"kept, {skipped:,} skipped{f' ({reasons})' if reasons else ''}; {event.tokens:,} tokens, "
            f"{event.trained_tokens:,} trained"
        ]
        lines += [f"  skipped {m}" for m in event.skipped_examples]
        if skipped > len(event.skipped_examples):
            lines.append(f"  ... {skipped - len(event.skipped_examples):,} more: `hone data check` lists every one")
        return lines + [f"  source not read: {m}" for m in event.problems] + [f"  note: {n}" for n in event.notes]
    if isinstance(event, events.Notice):
        return [f"{'warning' if event.level == 'warning' else 'note'}: {event.topic}: {event.message}"]
    if isinstance(event, events.RunStarted):
        what = f"resumed from step {event.resumed_from_step}" if event.resumed_from_step else "started"
        lines = [
            f"{what}: {event.model} on {event.device} ({event.dtype}), {event.total_steps} steps, "
            f"{event.params_trainable:,} of {event.params_total:,} parameters trained, "
            f"{event.tokens_per_epoch:,} tokens per epoch"
        ]
        return lines + [f"  {path}: {speed_choice(event.device, choice)}" for path, choice in event.speed_paths.items()]
    if isinstance(event, events.StepMetrics):
        return [step_line(event)]
    if isinstance(event, events.EvalMetrics):
        return [f"eval at step {event.step}: loss {event.loss:.4f} over {event.tokens:,} trained tokens"]
    if isinstance(event, events.CheckpointSaved):
        return [f"checkpoint at step {event.step}: {event.path}"]
    if isinstance(event, events.RunPaused):
        return [f"paused at step {event.step}"]
    if isinstance(event, events.RunResumed):
        return [f"continued at step {event.step}"]
    if isinstance(event, events.RunFinished):
        loss_part = f"final loss {event.final_loss:.4f}" if math.isfinite(event.final_loss) else "no loss recorded"
        eval_part = f", eval loss {event.eval_loss:.4f}" if event.eval_loss is not None else ""
        return [
            f"{'stopped' if event.stopped else 'finished'} after {event.step} steps in {event.elapsed:.0f} s: "
            f"{loss_part}{eval_part}; adapter {event.adapter_dir}"
        ]
    if isinstance(event, events.RunFailed):
        lines = [f"failed at step {event.step}: {event.reason}"]
        if event.advice:
            lines.append(f"  advice: {event.advice}")
        return lines + [f"  {line}" for line in event.details.rstrip().splitlines()]
    return []

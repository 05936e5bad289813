"""What the trainer holds about its run for checkpoints and a resume: the facts each checkpoint records (config,
data hashes, layout, epoch, length), and a resume's data position, length, schedule and notices once the checkpoint
is loaded (`RunFacts.resume`). The checks before anything loads are resume_checks.py's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.events import Notice
from hone.core.train.data_hashes import data_fingerprint, layout_of
from hone.core.train.resume_checks import TOPIC, check_resume, write_config
from hone.core.train.resume_schedule import apply_update_settings, epoch_start, retarget_schedule, total_steps_from


@dataclass
class Resumed:
    """Where a resumed run goes on: data position, steps in all, and what to tell the user."""

    position: int
    total: int
    notices: list[Notice]


class RunFacts:
    """What the trainer records in each checkpoint about its run, and the checks and changes of a resume.

    Args:
        config: the run config as given (before the memory fit).
        resume_dir: the run folder being resumed, or None for a new run.
        data_changed: refuse | restart-epoch | continue (see `check_resume`).

    Raises:
        HoneError: the resume would change what the run trains (from `check_resume`).
    """

    def __init__(self, config: RunConfig, resume_dir: str | Path | None = None, data_changed: str = "refuse"):
        self.config = config
        self.fingerprint = data_fingerprint(config.data)  # once per run; each checkpoint records it
        self.check = (
            check_resume(resume_dir, config, data_changed, fingerprint=self.fingerprint)
            if resume_dir is not None
            else None
        )
        self.layout: dict = {}
        self.total = 0
        self._stream = None

    def start(self, run_dir: Path) -> list[Notice]:
        """Once the run folder is open: bring its config.toml up to date; the notices of the checks."""
        if self.check is None:
            return []
        notices = list(self.check.notices)
        kept = write_config(run_dir, self.config, self.check)
        if kept is not None:
            notices.append(
                Notice(
                    topic=TOPIC,
                    step=self.check.step + 1,
                    message=(
                        f"config.toml now holds the settings this run goes on with; the one before is {kept.name}"
                    ),
                )
            )
        return notices

    def keep_pack_order(self, config: RunConfig) -> tuple[RunConfig, list[Notice]]:
        return self.check.keep_pack_order(config) if self.check is not None else (config, [])

    def attach(self, stream, train_set, total: int, tokenizer) -> None:
        """Record the tokenized training data's layout and the run's length once the pack stream exists."""
        from hone.core.data.cache import tokenizer_fingerprint

        try:
            tokenizer_id = tokenizer_fingerprint(getattr(tokenizer, "tokenizer", tokenizer))
        except Exception:  # a processor without a plain vocabulary: the row lengths still tell
            tokenizer_id = ""
        self._stream, self.total = stream, total
        self.layout = layout_of(train_set.lengths, self.config, batch_tokens=stream.budget, tokenizer=tokenizer_id)

    def resume(self, state: dict, stream, optimizer, scheduler, config: RunConfig) -> Resumed:
        """After the checkpoint `state` (its state.json) is loaded into optimizer and scheduler: the data position
        and the run's length to go on with; the new schedule, clipping and weight decay are set."""
        check = self.check
        step, position = int(state["step"]), int(state["position"])
        if check is None or check.checkpoint is None or step != check.step:
            raise HoneError(
                f"the newest checkpoint of {check.run_dir if check else 'the run'} changed while the run "
                "was starting (is another process training in this folder?)",
                "let that process finish, then resume again",
            )
        notices = check.check_layout(self.layout)
        if check.train_changed and check.data_changed == "restart-epoch":
            epoch = int(state.get("epoch", 0))
            position = epoch_start(stream, epoch)
            notices.append(
                Notice(
                    topic=TOPIC,
                    level="warning",
                    step=step + 1,
                    message=(
                        f"epoch {epoch + 1} starts over: step {step + 1} takes the first pack of the new data's order "
                        f"({len(stream.plan(epoch)):,} packs in this epoch)"
                    ),
                )
            )
        baseline = check.baseline
        trained_total = int(
            state.get("total_steps") or total_steps_from(baseline, stream, step, int(state["position"]))
        )
        total = total_steps_from(config, stream, step, position)
        if total < step:
            raise HoneError(
                f"train.epochs = {config.train.epochs} ends the run before step {step}, which the "
                "checkpoint has reached",
                "raise train.epochs, or leave it as the run had it",
            )
        # As restored: the lr and weight decay the optimizer ran with (also right for checkpoints without a record).
        before = dataclasses.replace(
            baseline.train,
            lr=scheduler.base_lrs[0],
            weight_decay=optimizer.param_groups[0].get("weight_decay", baseline.train.weight_decay),
        )
        said = retarget_schedule(optimizer, scheduler, before, config.train, trained_total, total, step)
        said = ([said] if said else []) + apply_update_settings(optimizer, before, config.train)
        notices += [Notice(topic=TOPIC, level="warning", step=step + 1, message=m) for m in said]
        self.total = total
        return Resumed(position, total, notices)

    def record(self, position: int) -> dict:
        """What a checkpoint at data `position` records besides its step (see the module docstring)."""
        epoch = self._stream.locate(position)[0] if self._stream is not None else 0
        return {
            "config": self.config.to_dict(),
            "data": self.fingerprint,
            "layout": self.layout,
            "epoch": epoch,
            "total_steps": self.total,
        }

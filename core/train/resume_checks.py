"""What a resumed run may change, and what each checkpoint records so that a resume can tell.

Besides the step and the data position, a checkpoint's state.json records (`RunFacts.record`):

    config       the run config as given (before the memory fit), as a dict
    data         each training and evaluation file: name, path, size and sha256 (`data_fingerprint`)
    layout       what decides the pack order beyond the files: rows, tokens, a hash of the row lengths, the
                 tokenizer's fingerprint, batch_tokens (after the memory fit), packing, seed, grad_accum
    epoch        the epoch the data position is in
    total_steps  the run's length in optimizer steps, which the learning-rate schedule is laid out over

`hone train --resume` and the app's Resume compare the config given now with the checkpoint's, setting by
setting, under `ON_RESUME`:

    safe      how steps run or are saved, not what they train: applied, said as a note
    schedule  the learning rate, schedule, warmup and the run's length: applied from the next step, the schedule
              laid out anew over the new length, and the learning rate before and after said
    update    clipping and weight decay: applied to the restored optimizer from the next step, said
    eval      the evaluation data: applied, with a warning that eval losses change meaning
    refused   what the adapter is, what it trains on, or where in the data the run is: the resume stops, naming
              each setting, why, and the command for a new run with it

Training files that changed since the checkpoint stop the resume too, unless the user accepts them
(`--data-changed restart-epoch` starts the current epoch over on the new data, `continue` keeps the position);
changed evaluation files are a warning. The run folder's config.toml is then brought up to date, the one before
kept as config.<n>.toml, and every change goes to the run's log as a `resume` notice with the step it applies from.

`check_resume` reads only config.toml and state.json and hashes the data, so `hone train` refuses before a model
loads or the run folder is written; `RunFacts.resume` does the rest once the checkpoint is loaded.

The parts have modules of their own: resume_rules.py (`ON_RESUME`, the setting changes), data_hashes.py (the data
fingerprint and layout) and resume_schedule.py (length, schedule and optimizer settings on resume), whose names this
module re-exports, and run_facts.py (`RunFacts`, what the trainer holds), which builds on this module.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from hone.core.config import RunConfig, to_toml
from hone.core.errors import HoneError
from hone.core.events import Notice
from hone.core.train.data_hashes import (  # noqa: F401  (re-exported)
    data_differences,
    data_fingerprint,
    file_digest,
    layout_of,
)
from hone.core.train.resume_rules import (  # noqa: F401  (re-exported)
    KINDS,
    ON_RESUME,
    Change,
    Rule,
    config_changes,
    toml_value,
)
from hone.core.train.resume_schedule import (  # noqa: F401  (re-exported)
    apply_update_settings,
    epoch_start,
    retarget_schedule,
    total_steps_from,
)
from hone.core.train.run_dir import CONFIG_FILE, read_summary
from hone.core.train.run_lock import refuse_if_in_use

TOPIC = "resume"
DATA_CHANGED = ("refuse", "restart-epoch", "continue")
STATE_FILE = "state.json"  # a checkpoint's step, position and the record below (checkpoints.py writes it)


def _load_config(path: Path) -> RunConfig | None:
    try:
        return RunConfig.load(path)
    except (HoneError, OSError):
        return None


@dataclass
class ResumeCheck:
    """What `check_resume` found: the checkpoint, the setting changes it allows, what changed in the data, and the
    notices to give once the run folder is open."""

    run_dir: Path
    config: RunConfig
    data_changed: str
    checkpoint: Path | None = None
    step: int = 0
    state: dict = field(default_factory=dict)
    baseline: RunConfig | None = None  # the config the checkpoint was trained with
    changes: list[Change] = field(default_factory=list)
    data_diff: dict[str, list[str]] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)

    @property
    def train_changed(self) -> bool:
        return bool(self.data_diff.get("train"))

    def _data_advice(self, what: str) -> str:
        epoch = int(self.state.get("epoch", 0)) + 1
        return (
            f"to go on with this run on {what}, add --data-changed restart-epoch (epoch {epoch} starts over on "
            "it) or --data-changed continue (the run goes on at the same place in the data order); to train on "
            f"it from the start, begin a new run: hone train {self.run_dir / CONFIG_FILE} (--set "
            "data.train=[...] for other files); or put the old data back"
        )

    def check_layout(self, layout: dict) -> list[Notice]:
        """Compare the tokenized training data's layout with the checkpoint's: HoneError when it differs under
        unchanged files and the user did not accept changed data; notices otherwise."""
        recorded = self.state.get("layout")
        keys = ("rows", "tokens", "lengths_sha256")
        if not recorded or all(recorded.get(k) == layout.get(k) for k in keys) or self.train_changed:
            return []
        what = (
            f"{recorded['rows']:,} rows of {recorded['tokens']:,} tokens then, {layout['rows']:,} rows of "
            f"{layout['tokens']:,} tokens now"
        )
        if recorded.get("tokenizer") != layout.get("tokenizer"):
            what += "; the model's tokenizer changed"
        message = (
            f"the training files are the ones step {self.step} was trained on, but they tokenize into other "
            f"rows ({what}), so the packs and the place in the data would not be the ones trained"
        )
        if self.data_changed == "refuse":
            raise TrainingDataChanged(message, self._data_advice("the data as it tokenizes now"))
        self.data_diff.setdefault("train", []).append("tokenized rows")
        return [
            Notice(
                topic=TOPIC,
                level="warning",
                step=self.step + 1,
                message=f"{message}; going on as --data-changed {self.data_changed} says",
            )
        ]

    def keep_pack_order(self, config: RunConfig) -> tuple[RunConfig, list[Notice]]:
        """`config` (after any memory fit) with the batch_tokens the run packed its rows with: a resume keeps the
        data order it trained in, whatever the fit picks on this start (or picked on an earlier one)."""
        trained = self.state.get("layout", {}).get("batch_tokens")
        if not trained or trained == config.train.batch_tokens:
            return config, []
        picked = config.train.batch_tokens
        kept = config.with_overrides([f"train.batch_tokens={trained}"])
        return kept, [
            Notice(
                topic=TOPIC,
                level="warning",
                step=self.step + 1,
                message=(
                    f"this start would pack rows with train.batch_tokens = {picked}, "
                    f"but the run packed them with {trained} "
                    f"up to step {self.step} (the memory fit picks it from the memory free at each start); it keeps "
                    f"{trained} so the data order stays the one trained (a step that runs out of memory runs again as "
                    "smaller micro-batches of the same rows)"
                ),
            )
        ]


class TrainingDataChanged(HoneError):
    """A resume found other training data than the checkpoint was trained on, and was not told what to do: go on
    with `data_changed` restart-epoch or continue (the Studio asks)."""

    code = "data-changed"


def check_resume(
    run_dir: str | Path,
    config: RunConfig,
    data_changed: str = "refuse",
    *,
    checkpoint: Path | None = None,
    fingerprint: dict | None = None,
) -> ResumeCheck:
    """Check a resume of `run_dir` with `config` before anything loads: refuse (HoneError) a setting that may not
    change on resume or training data that changed (unless `data_changed` accepts it); return what is allowed.

    Args:
        run_dir: the run folder.
        config: the config the run is to go on with (its config.toml or another file, with --set applied).
        data_changed: refuse | restart-epoch | continue: what to do when the training files changed.
        checkpoint: the checkpoint to resume from; None = the one `checkpoints.resumable_checkpoint` picks.
        fingerprint: `data_fingerprint(config.data)` when already computed.
    """
    if data_changed not in DATA_CHANGED:
        raise ValueError(f"data_changed must be one of {DATA_CHANGED}, not {data_changed!r}")
    run_dir = Path(run_dir)
    refuse_if_in_use(run_dir)  # a run training there now: say so rather than judge a checkpoint it is writing
    from hone.core.train.checkpoints import read_state, resumable_checkpoint  # the trainer's own reader and choice

    if checkpoint is None:
        checkpoint = resumable_checkpoint(run_dir)[0]
    stored = _load_config(run_dir / CONFIG_FILE)
    check = ResumeCheck(run_dir, config, data_changed, baseline=stored or config)
    if checkpoint is None:
        return check
    check.checkpoint = Path(checkpoint)
    check.state = state = read_state(check.checkpoint)  # a damaged state.json: one HoneError naming it and the field
    check.step = step = int(state["step"])
    recorded = None
    if isinstance(state.get("config"), dict):
        try:
            recorded = RunConfig.from_dict(state["config"], source=str(check.checkpoint / STATE_FILE))
        except HoneError:
            recorded = None
    check.baseline = baseline = recorded or stored or config
    check.changes = config_changes(baseline.to_dict(), config.to_dict())
    _refuse_changes(check)
    fingerprint = data_fingerprint(config.data) if fingerprint is None else fingerprint
    if "data" not in state:
        check.notices.append(
            Notice(
                topic=TOPIC,
                level="warning",
                step=step + 1,
                message=(
                    f"checkpoint {check.checkpoint.name} was saved by a Hone that did not record its data, so the data "
                    "cannot be checked against what was trained; the checkpoints from now on record it"
                ),
            )
        )
    else:
        check.data_diff = data_differences(state["data"], fingerprint)
    _check_data(check)
    _refuse_a_finished_run(check)
    for change in check.changes:
        if change.rule.kind in ("safe", "eval"):
            check.notices.append(
                Notice(
                    topic=TOPIC,
                    level="info" if change.rule.kind == "safe" else "warning",
                    step=step + 1,
                    message=f"{change} from step {step + 1}: {change.rule.why}",
                )
            )
    return check


def _refuse_changes(check: ResumeCheck) -> None:
    refused = [c for c in check.changes if c.rule.kind == "refused"]
    problems = [f"{c} ({c.rule.why})" for c in refused]
    max_steps = check.config.train.max_steps
    if max_steps and max_steps < check.step:
        problems.append(
            f"train.max_steps = {max_steps} ends the run before step {check.step}, which the checkpoint has reached"
        )
    if not problems:
        return
    message = (
        f"cannot resume {check.run_dir} at step {check.step} with "
        f"{'this setting' if len(problems) == 1 else 'these settings'} changed: " + "; ".join(problems)
    )
    advice = []
    if refused:
        sets = " ".join(f"--set {c.key}={toml_value(c.new)}" for c in refused)
        advice.append(
            f"to go on with this run, keep {'that setting' if len(refused) == 1 else 'those settings'} "
            f"as trained (drop the --set, or put back what config.toml had); to train with "
            f"{'it' if len(refused) == 1 else 'them'}, start a new run: hone train "
            f"{check.run_dir / CONFIG_FILE} {sets}"
        )
    if max_steps and max_steps < check.step:
        advice.append(f"set train.max_steps to {check.step} or more")
    raise HoneError(message, "; ".join(advice))


def _refuse_a_finished_run(check: ResumeCheck) -> None:
    """A finished run whose newest checkpoint is its last step, resumed at the same length, would train nothing and
    only write its final eval, checkpoint and adapter a second time: refuse it before anything is written. A run
    killed after its last checkpoint but before it finished goes on: the resume saves its adapter."""
    total = check.state.get("total_steps")
    lengthened = any(c.key in ("train.max_steps", "train.epochs") for c in check.changes) or check.train_changed
    if not isinstance(total, int) or total <= 0 or check.step < total or lengthened:
        return
    summary = read_summary(check.run_dir)
    if summary is None or summary.status != "finished":
        return
    raise HoneError(
        f"{check.run_dir} has already finished: its newest checkpoint is step {check.step} of {total}",
        f"to train it further, resume with a longer run (--set train.max_steps={2 * total}, or more "
        f"train.epochs); its adapter is in {check.run_dir / 'adapter'}",
    )


def _check_data(check: ResumeCheck) -> None:
    step, mode = check.step, check.data_changed
    if check.train_changed:
        what = "; ".join(check.data_diff["train"])
        if mode == "refuse":
            raise TrainingDataChanged(
                f"the training data changed since checkpoint {check.checkpoint.name} (step {step}) was saved: {what}",
                check._data_advice("the data as it is now"),
            )
        how = (
            f"epoch {int(check.state.get('epoch', 0)) + 1} starts over on the new data"
            if mode == "restart-epoch"
            else "the run goes on at the same place in the data order, now the new data's: rows may come twice "
            "in this epoch, or not before the next"
        )
        check.notices.append(
            Notice(
                topic=TOPIC,
                level="warning",
                step=step + 1,
                message=(
                    f"the training data changed since step {step}: {what}; "
                    f"going on as --data-changed {mode} says: {how}"
                ),
            )
        )
    if check.data_diff.get("eval"):
        check.notices.append(
            Notice(
                topic=TOPIC,
                level="warning",
                step=step + 1,
                message=(
                    f"the evaluation data changed since step {step}: {'; '.join(check.data_diff['eval'])}; evaluation "
                    "losses from here on are over other rows than before"
                ),
            )
        )


def write_config(run_dir: str | Path, config: RunConfig, check: ResumeCheck) -> Path | None:
    """Make the run folder's config.toml say `config`, keeping the one before as config.<n>.toml (returned; None
    when config.toml already said it). Its first line says at which step and what changed."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    stored = _load_config(path)
    if stored is not None and stored.to_dict() == config.to_dict():
        return None
    kept = None
    if path.exists():
        n = 1
        while (run_dir / f"config.{n}.toml").exists():
            n += 1
        kept = run_dir / f"config.{n}.toml"
        shutil.copy2(path, kept)
    what = ", ".join(str(c) for c in check.changes) or "the settings below"
    header = f"# Resumed at step {check.step} with {what}"
    header += f" (the config before: {kept.name})\n" if kept else "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(header + to_toml(config.to_dict()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return kept

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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.config import SECTIONS, RunConfig, to_toml
from hone.core.errors import HoneError
from hone.core.events import Notice
from hone.core.train.run_dir import CONFIG_FILE, read_summary
from hone.core.train.run_lock import refuse_if_in_use

TOPIC = "resume"
DATA_CHANGED = ("refuse", "restart-epoch", "continue")
KINDS = ("safe", "schedule", "update", "eval", "refused")
STATE_FILE = "state.json"  # a checkpoint's step, position and the record below (checkpoints.py writes it)


@dataclass(frozen=True)
class Rule:
    """What a resume does when a setting differs from the checkpoint's: `kind` (one of KINDS) and why."""

    kind: str
    why: str


_MODEL = Rule("refused", "it is the base model the adapter's weights belong to")
_DTYPE = Rule("refused", "the optimizer and loss-scaler state were saved for the weights' old dtype")
_ADAPTER = Rule(
    "refused",
    "it changes the adapter or what it trains; the checkpoint's weights and optimizer state are the old adapter's",
)
_ROWS = Rule(
    "refused",
    "it changes how rows become tokens, so the packs and the place in the data would no longer be the ones trained",
)
_ORDER = Rule(
    "refused", "it decides how rows are packed into steps, so the run would go on at another place in the data"
)
_FOLDER = Rule("refused", "it names a new run's folder; a resumed run stays in its own")
_SCHEDULE = Rule("schedule", "the learning-rate schedule, laid out anew from the next step")
_HOW = Rule("safe", "how steps run, not what they train")
_SAVING = Rule("safe", "how often the run evaluates or saves")

ON_RESUME: dict[str, Rule] = {
    "model.name_or_path": _MODEL,
    "model.gguf_file": _MODEL,
    "model.revision": _MODEL,
    "model.trust_remote_code": _MODEL,
    "model.dtype": _DTYPE,
    "data.train": Rule("refused", "it is the training data; a run on other data is a new run"),
    "data.eval": Rule("eval", "evaluation losses from here on are over other rows than before"),
    "data.eval_fraction": Rule("refused", "it moves rows between the training and the evaluation data"),
    "data.format": _ROWS,
    "data.columns": _ROWS,
    "data.max_length": _ROWS,
    "data.overlong": _ROWS,
    "data.train_on": _ROWS,
    "data.image_max_side": _ROWS,
    "data.chat_template": _ROWS,
    "data.allow_private_urls": Rule(
        "refused",
        "it decides which image rows are read, so the packs and the place in "
        "the data would no longer be the ones trained",
    ),
    **{f"lora.{f.name}": _ADAPTER for f in dataclasses.fields(SECTIONS["lora"])},
    "train.max_steps": _SCHEDULE,
    "train.epochs": _SCHEDULE,
    "train.lr": _SCHEDULE,
    "train.schedule": _SCHEDULE,
    "train.warmup_steps": _SCHEDULE,
    "train.warmup_ratio": _SCHEDULE,
    "train.batch_tokens": _ORDER,
    "train.grad_accum": _ORDER,
    "train.seed": Rule("refused", "it decides the data order (and the adapter's initialization)"),
    "train.optimizer": Rule("refused", "the checkpoint's optimizer state is the old optimizer's"),
    "train.fit_memory": _HOW,
    "train.parallel": _HOW,
    "train.method": Rule("refused", "it changes what the run optimizes and the rows it reads (pairs or single rows)"),
    **{
        f"preference.{f.name}": Rule("update", "the preference loss's settings")
        for f in dataclasses.fields(SECTIONS["preference"])
    },
    # GRPO: the group and answer length set each prompt's planned tokens (how rows are packed); the rest shape
    # sampling, rewards and the loss from the next step
    **{
        f"grpo.{f.name}": Rule("update", "GRPO's sampling, rewards and loss")
        for f in dataclasses.fields(SECTIONS["grpo"])
    },
    "grpo.num_generations": _ORDER,
    "grpo.max_completion_length": _ORDER,
    "train.max_grad_norm": Rule("update", "gradient clipping"),
    "train.weight_decay": Rule("update", "AdamW weight decay"),
    "train.eval_every": _SAVING,
    **{f"speed.{f.name}": _HOW for f in dataclasses.fields(SECTIONS["speed"])},
    "speed.packing": _ORDER,
    "output.runs_dir": _FOLDER,
    "output.name": _FOLDER,
    "output.checkpoint_every": _SAVING,
    "output.checkpoint_minutes": _SAVING,
    "output.keep_checkpoints": _SAVING,
    "output.report_to": _SAVING,
}
# A setting added to the config later is refused until it gets its own rule (a test asks for one per setting).
_UNKNOWN = Rule("refused", "it is not known to be safe to change in a resumed run")
_SCHEDULE_KEYS = ("lr", "schedule", "warmup_steps", "warmup_ratio", "max_steps", "epochs")


def _toml(value: Any) -> str:
    """A value as TOML writes it (and as --set reads it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Change:
    """One setting that differs from the checkpoint's: `key` as section.name, the values, and its rule."""

    key: str
    old: Any
    new: Any
    rule: Rule

    def __str__(self) -> str:
        return f"{self.key} {_toml(self.old)} → {_toml(self.new)}"


def config_changes(before: dict, after: dict) -> list[Change]:
    """The settings that differ between two `RunConfig.to_dict()`s, in the config's order."""
    changes = []
    for section in after:
        for name, new in after[section].items():
            old = before.get(section, {}).get(name, new)
            if old != new:
                key = f"{section}.{name}"
                changes.append(Change(key, old, new, ON_RESUME.get(key, _UNKNOWN)))
    return changes


# ---- the data fingerprint ----

_CHUNK = 1 << 20  # bytes per read while hashing: large enough for full disk speed, small enough to stream
# A file whose ctime is this recent when hashed is hashed again next time: an edit within the filesystem's
# timestamp tick would leave its stat unchanged (git's "racy" entries).
_RACY_NS = 1_000_000_000
# Digests by file identity and stat. Not run state: the hash of unchanged bytes, shared so that `hone train`'s early
# check and the trainer (and the app's next run) read a large file once.
_DIGESTS: dict[tuple, tuple[int, str]] = {}


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digest(path: str | Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of a file, streamed; an unchanged file (same inode, size, mtime and ctime) is
    read once per process."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = (st.st_size, _sha256_of(path))
    if time.time_ns() - st.st_ctime_ns > _RACY_NS:
        _DIGESTS[key] = digest
    return digest


def data_fingerprint(data) -> dict[str, list[dict]]:
    """Each file of a DataConfig's `train` and `eval` entries: {"name", "path", "size", "sha256"}, by side; a folder
    entry lists every file in it, a Hugging Face dataset id is listed without a hash (`layout_of` covers it). An
    entry that resolves to nothing is left out: the data loader says why."""
    from hone.core.data.loaders import SourceError, resolve_sources

    out: dict[str, list[dict]] = {}
    for side, entries in (("train", data.train), ("eval", data.eval)):
        files: list[dict] = []
        for entry in entries:
            try:
                sources = resolve_sources([entry], side=side)
            except (SourceError, HoneError, OSError):
                continue
            for source in sources:
                if source.path is None:
                    files.append({"name": source.name, "hub": True})
                    continue
                root = source.path
                paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
                for p in paths:
                    size, sha = file_digest(p)
                    name = source.name if p == root else f"{source.name}/{p.relative_to(root).as_posix()}"
                    files.append({"name": name, "path": str(p.resolve()), "size": size, "sha256": sha})
        out[side] = files
    return out


def data_differences(before: dict, after: dict) -> dict[str, list[str]]:
    """What differs between two `data_fingerprint`s, in words, by side ("train", "eval")."""
    out: dict[str, list[str]] = {}
    for side in ("train", "eval"):
        old = {f["name"]: f for f in before.get(side, [])}
        new = {f["name"]: f for f in after.get(side, [])}
        lines = []
        for name in [*old, *(n for n in new if n not in old)]:
            o, n = old.get(name), new.get(name)
            if o is None:
                lines.append(f"{name} is new")
            elif n is None:
                lines.append(f"{name} is no longer there")
            elif o.get("hub") or n.get("hub"):
                continue
            elif o["size"] != n["size"]:
                lines.append(
                    f"{name}: {o['size']:,} → {n['size']:,} bytes, sha256 {o['sha256'][:12]}… → {n['sha256'][:12]}…"
                )
            elif o["sha256"] != n["sha256"]:
                lines.append(
                    f"{name}: the same size ({n['size']:,} bytes) but other bytes, sha256 "
                    f"{o['sha256'][:12]}… → {n['sha256'][:12]}…"
                )
        if lines:
            out[side] = lines
    return out


def layout_of(lengths, config: RunConfig, *, batch_tokens: int, tokenizer: str) -> dict:
    """What decides the pack order besides the files: the tokenized rows' lengths (int64 array, one per row), the
    tokenizer's fingerprint, and the packing settings as trained (`batch_tokens` after the memory fit)."""
    import numpy as np

    lengths = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
    return {
        "rows": int(lengths.size),
        "tokens": int(lengths.sum()),
        "lengths_sha256": hashlib.sha256(lengths.tobytes()).hexdigest(),
        "tokenizer": tokenizer,
        "batch_tokens": int(batch_tokens),
        "packing": config.speed.packing,
        "seed": config.train.seed,
        "grad_accum": config.train.grad_accum,
    }


# ---- the schedule and the data position ----


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
        f"train.{k} {_toml(getattr(before, k))} → {_toml(getattr(after, k))}"
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
            f"train.weight_decay {_toml(before.weight_decay)} → {_toml(after.weight_decay)}: AdamW weight "
            "decay from the next step"
        )
    if before.max_grad_norm != after.max_grad_norm:
        said.append(
            f"train.max_grad_norm {_toml(before.max_grad_norm)} → {_toml(after.max_grad_norm)}: gradient "
            "clipping from the next step"
        )
    return said


# ---- the checks ----


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
        sets = " ".join(f"--set {c.key}={_toml(c.new)}" for c in refused)
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


# ---- what the trainer holds ----


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

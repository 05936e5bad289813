"""Run folders: one per run, holding everything needed to follow, resume and export it.

`RunWriter` writes config.toml, metrics.jsonl, train.log and run.json as a run goes (what each holds is beside its
name below), holding the folder's lock (run_lock.py) while it is open; checkpoints.py and adapter_dir.py write the
rest. Stdlib only, so the GUI's run history can read folders without torch.

Every JSON file here is strict JSON: a number that is not finite (a loss that became NaN) is written as null, and
`read_events` gives it back as NaN.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train import json_checks
from hone.core.train.run_lock import RunLock, in_use

# What RUN_DIR holds:
CONFIG_FILE = "config.toml"  # the RunConfig the run used
# Every event, one JSON object per line, each step once: append-only while a run goes (a write that fails is cut
# back, a partial last line from a kill is cut when the folder is opened again), and on resume the lines of steps
# after the checkpoint, trained again, are dropped (`RunWriter.forget_steps_after`).
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"  # human-readable log: the run's setup, steps, evals, checkpoints, the outcome (`log_lines`)
SUMMARY_FILE = "run.json"  # summary: status, steps, losses, paths (rewritten atomically)
ADAPTER_DIR = "adapter"  # the final PEFT adapter folder (adapter_dir.py)
CHECKPOINTS_DIR = "checkpoints"  # step-NNNNNN/ resumable states (checkpoints.py)
# run.lock: who trains in the folder now (run_lock.py)
INTERRUPTED = "interrupted"  # a run that says running, read back while no process trains it
DAMAGED = "damaged"  # a run whose run.json cannot be read (read_summary says why)
# What run.json may say. A run is written running, then finished, stopped, failed or interrupted (a GPU that stopped
# working); interrupted is also what a run that says running is read back as once no process trains it.
STATUSES = ("running", "finished", "stopped", "failed", INTERRUPTED)
# train.log gets a step line at most this often (and always for the first and last step): every step of a slow run,
# a readable trace of a fast one; metrics.jsonl keeps every step.
LOG_STEP_EVERY_S = 10.0


@dataclass
class RunSummary:
    """What the run history shows for one run (from run.json)."""

    run_dir: str
    name: str
    model: str
    status: str  # running | finished | stopped | failed; read back, also interrupted (live_summary) or damaged
    step: int = 0
    total_steps: int = 0
    final_loss: float | None = None
    eval_loss: float | None = None
    started: float = 0.0
    updated: float = 0.0
    reason: str = ""  # why it failed, or why it is damaged

    @property
    def has_adapter(self) -> bool:
        return (Path(self.run_dir) / ADAPTER_DIR / "adapter_config.json").is_file()

    @property
    def advice(self) -> str:
        """What to do about a damaged run ("" for any other)."""
        if self.status != DAMAGED:
            return ""
        return (
            "the run's checkpoints and adapter are untouched: `hone train --resume "
            f"{self.run_dir}` still works if its config.toml and a checkpoint are intact (and writes run.json anew); "
            "or delete the folder"
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


# The longest path Hone writes inside a run folder, with room to spare (an export's staging folder holding a
# sharded model: exports/.merged-bf16.partial-XXXXXXXX/merged-bf16/model-00001-of-00002.safetensors).
_LONGEST_INSIDE = 120


def check_run_path(run_dir: Path) -> None:
    """Refuse a run folder whose path, or a name in it, is longer than this system allows, or leaves no room for the
    files a run writes inside it, before anything is written.

    Raises:
        HoneError: naming the path, its length and the system's limit.
    """
    path = Path(os.path.abspath(run_dir))
    existing = next(p for p in (path, *path.parents) if os.path.exists(p))  # False for a name too long
    name_max, path_max = 255, 260  # Windows without long paths; NTFS names
    if hasattr(os, "pathconf"):
        with contextlib.suppress(OSError, ValueError):
            name_max = os.pathconf(existing, "PC_NAME_MAX")
            path_max = os.pathconf(existing, "PC_PATH_MAX")
    long_name = next((part for part in path.parts if len(part.encode("utf-8")) > name_max), None)
    if long_name is not None:
        raise HoneError(
            f"the run folder {path} has a name of {len(long_name.encode('utf-8'))} bytes in its path "
            f"({long_name[:40]}...), and this file system allows {name_max}",
            "choose a shorter output.name or output.runs_dir",
        )
    size = len(str(path).encode("utf-8"))
    if size + _LONGEST_INSIDE >= path_max:
        raise HoneError(
            f"the run folder's path is {size} bytes long ({path}); with the {_LONGEST_INSIDE} the files inside it "
            f"need, that passes this system's limit of {path_max}",
            f"choose output.runs_dir and output.name so that the run folder's path stays under "
            f"{path_max - _LONGEST_INSIDE} bytes",
        )


def new_run_dir(config: RunConfig) -> Path:
    """A fresh folder under output.runs_dir: output.name, or date-time plus model name; never reuses a folder.

    Raises:
        HoneError: the folder's path is too long for this system (`check_run_path`); nothing is made then.
    """
    root = Path(config.output.runs_dir).expanduser()
    model = Path(config.model.name_or_path.replace(":", "/")).name
    base = config.output.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(model)}"
    candidate, n = root / base, 2
    check_run_path(candidate)
    while candidate.exists() and any(candidate.iterdir()):
        candidate, n = root / f"{base}-{n}", n + 1
    check_run_path(candidate)
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


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


# A write that fails with one of these ran out of room: the disk is full (ENOSPC), a quota is used up (EDQUOT), or
# a file reached the size the file system or a limit allows (EFBIG).
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _DISK_FULL


def disk_full_error(error: OSError, what: str, run_dir: Path) -> HoneError:
    """The HoneError for a write of `what` that found no room: the disk, the file, and what to do."""
    where = f" ({error.filename})" if error.filename else ""
    return HoneError(
        f"the disk is full: {what} could not be written in {run_dir}{where}: {error.strerror}",
        f"free space on the disk holding {run_dir}, then `hone train --resume {run_dir}` goes on from "
        "the last checkpoint",
    )


def json_safe(data):
    """`data` with every float that is not finite replaced by None, so json.dumps(allow_nan=False) can write it."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def replace_with(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk and rename it over `path`; on an error the
    temporary file is removed and `path` is as it was."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data) -> None:
    """Write `data` as strict JSON to a temporary file, flush it to disk, rename it over `path`. When the disk is too
    full for the temporary file, `path` is overwritten in place instead (a small file keeps its blocks), so run.json
    can still say the run failed."""
    text = json.dumps(json_safe(data), indent=2, allow_nan=False).encode("utf-8")
    try:
        replace_with(path, text)
    except OSError as e:
        if not (is_disk_full(e) and path.is_file()):
            raise
        try:
            with open(path, "r+b") as f:
                f.write(text)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            raise e from None


class _LineFile:
    """An append-only file of lines, each written whole or not at all: a write that fails (a full disk) is cut back
    to the last whole line, and a partial last line left by a killed process is cut when the file is opened."""

    def __init__(self, path: Path, *, cut_partial: bool):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        self.size = os.fstat(self.fd).st_size
        if cut_partial and self.size:
            whole = _whole_lines_size(path, self.size)
            if whole < self.size:
                os.ftruncate(self.fd, whole)
                self.size = whole

    def append(self, text: str) -> None:
        data, done = text.encode("utf-8"), 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            raise
        self.size += len(data)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)


def _whole_lines_size(path: Path, size: int) -> int:
    """Bytes of `path` up to and with its last newline (0 when it has none)."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - (1 << 16))
            f.seek(start)
            chunk = f.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0


# Events tied to a step that a resume trains again: `forget_steps_after` drops those of later steps.
_STEP_EVENTS = {"StepMetrics", "EvalMetrics", "CheckpointSaved", "Notice"}


class RunWriter:
    """Appends events to metrics.jsonl, lines to train.log, and keeps run.json current, holding the folder's lock.

    Args:
        run_dir: the run folder (made if missing).
        config: written as config.toml unless the folder has one.
        created: the folder was made for this run (`new_run_dir`): `close` removes it again when the run ended before
            it started (no RunStarted) and left no traceback to read, so a failed attempt leaves no folder behind.

    Raises:
        RunFolderBusy: another process trains in the folder (nothing is written then).
        HoneError: the disk is full, from here or from `write` (a RunFailed is written as far as the disk allows and
            never raises).
    """

    def __init__(self, run_dir: Path, config: RunConfig, *, created: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock = RunLock.acquire(self.run_dir)  # before anything else: a second process touches nothing
        self._keep = not created  # a folder the run did not make is never removed
        self.last_loss = float("nan")  # of the last step written (or kept by forget_steps_after)
        try:
            if not (self.run_dir / CONFIG_FILE).exists():
                config.save(self.run_dir / CONFIG_FILE)
            self._metrics = _LineFile(self.run_dir / METRICS_FILE, cut_partial=True)
            self._log = _LineFile(self.run_dir / LOG_FILE, cut_partial=False)
            if self._log.size and _whole_lines_size(self.run_dir / LOG_FILE, self._log.size) < self._log.size:
                self._log.append("\n")  # a killed run's last words stay, on a line of their own
        except OSError as e:
            self._lock.release()
            if created:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            if is_disk_full(e):
                raise disk_full_error(e, "the run folder", self.run_dir) from e
            raise
        self._attempt_start = self._metrics.size  # metrics.jsonl before this attempt wrote to it
        previous = read_summary(self.run_dir)
        self.summary = previous or RunSummary(
            run_dir=str(self.run_dir),
            name=self.run_dir.name,
            model=config.model.name_or_path,
            status="running",
            started=time.time(),
        )
        self.summary.status = "running"
        self.summary.reason = ""
        self._last_step_logged = 0.0

    def _log_line(self, text: str) -> None:
        self._log.append(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def log(self, text: str) -> None:
        """A line in train.log. Raises HoneError when the disk is full."""
        try:
            self._log_line(text)
        except OSError as e:
            if is_disk_full(e):
                raise disk_full_error(e, LOG_FILE, self.run_dir) from e
            raise

    def write(self, event: events.Event) -> None:
        """Append the event to metrics.jsonl and, in words, to train.log; keep run.json current."""
        if isinstance(event, events.RunStarted) or (isinstance(event, events.RunFailed) and event.details):
            self._keep = True  # a started run, or a traceback the user is sent to train.log for
        if isinstance(event, events.StepMetrics):
            self.last_loss = event.loss
        failed = None
        for part in (self._write_metrics, self._write_log, self._update_summary):
            try:
                part(event)
            except OSError as e:
                failed = failed or e
        if failed is None or isinstance(event, events.RunFailed):
            return  # a run that failed is recorded as far as the disk allows: it never fails again here
        if is_disk_full(failed):
            raise disk_full_error(failed, f"the {type(event).__name__} event", self.run_dir) from failed
        raise failed

    def _write_metrics(self, event: events.Event) -> None:
        self._metrics.append(json.dumps(json_safe(events.to_dict(event)), allow_nan=False) + "\n")

    def _write_log(self, event: events.Event) -> None:
        if isinstance(event, events.StepMetrics):
            now = time.monotonic()
            if event.step > 1 and event.step != event.total_steps and now - self._last_step_logged < LOG_STEP_EVERY_S:
                return
            self._last_step_logged = now
        for line in log_lines(event):
            self._log_line(line)

    def _update_summary(self, event: events.Event) -> None:
        s = self.summary
        if isinstance(event, events.RunStarted):
            s.total_steps, s.step = event.total_steps, event.resumed_from_step
        elif isinstance(event, events.StepMetrics):
            s.step, s.final_loss = event.step, event.loss
            if event.step % 10 and event.step != event.total_steps:
                return  # run.json is a summary: rewrite it every 10 steps, not every step
        elif isinstance(event, events.EvalMetrics):
            s.eval_loss = event.loss
        elif isinstance(event, events.RunFinished):
            s.status = "stopped" if event.stopped else "finished"
            s.step = event.step
        elif isinstance(event, events.RunFailed):
            s.status, s.reason = INTERRUPTED if event.interrupted else "failed", event.reason
        else:
            return
        s.updated = time.time()
        write_json_atomic(self.run_dir / SUMMARY_FILE, asdict(s))

    def forget_steps_after(self, step: int) -> None:
        """A resume from the checkpoint of `step`: drop from metrics.jsonl what earlier attempts wrote about later
        steps (StepMetrics, EvalMetrics, CheckpointSaved, and Notices that take effect after `step`), since those
        steps are trained again; every other line stays, in order. Sets `last_loss` to the loss of step `step`."""
        path = self.run_dir / METRICS_FILE
        with open(path, "rb") as f:
            earlier, this_attempt = f.read(self._attempt_start), f.read()
        kept = []
        for line in earlier.splitlines(keepends=True):
            try:
                data = json.loads(line)
                at = data.get("step") if type(data.get("step")) is int else 0  # not a bool, not text
                later = data.get("event") in _STEP_EVENTS and at > step
                this = data.get("event") == "StepMetrics" and at == step
            except (ValueError, RecursionError, AttributeError, TypeError):
                continue  # no line Hone writes: cut by a kill, or damaged (not an object, an event that is a list)
            if later:
                continue
            if this:
                loss = data.get("loss")
                self.last_loss = float(loss) if isinstance(loss, (int, float)) else math.nan
            kept.append(line)
        text = b"".join(kept) + this_attempt
        if len(text) == self._metrics.size:
            return
        self._metrics.close()  # Windows renames over no open file
        try:
            replace_with(path, text)
        except OSError as e:
            if is_disk_full(e):
                raise disk_full_error(e, METRICS_FILE, self.run_dir) from e
            raise
        finally:
            self._metrics = _LineFile(path, cut_partial=False)
            self._attempt_start = self._metrics.size - len(this_attempt)

    def close(self) -> None:
        """Close the files and give the lock back; a folder made for a run that never started is removed."""
        self._metrics.close()
        self._log.close()
        self._lock.release()
        if not self._keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)


# run.json is a few hundred bytes (its longest field, a failure's reason, is one message): a larger one is not Hone's.
MAX_SUMMARY_BYTES = 1 << 20
# RunSummary's fields as run.json holds them: each one's check (json_checks); run_dir is the folder read, always.
_SUMMARY_RULES: dict[str, json_checks.Rule] = {
    "name": json_checks.text,
    "model": json_checks.text,
    "status": json_checks.one_of(STATUSES),
    "step": json_checks.count,
    "total_steps": json_checks.count,
    "final_loss": json_checks.optional(json_checks.finite),
    "eval_loss": json_checks.optional(json_checks.finite),
    "started": json_checks.moment,
    "updated": json_checks.moment,
    "reason": json_checks.text,
}


def read_summary(run_dir: Path) -> RunSummary | None:
    """The run's run.json, every field checked against its type and range; None when the folder has none (it is no
    run). Never raises: a run.json that cannot be read whole (no regular file, larger than MAX_SUMMARY_BYTES, not
    UTF-8, not JSON, not an object) or with a field of another type or range gives status "damaged", the reason
    naming the file and each field ("run.json: started is 'yesterday', not a time") and `advice` what to do. The
    fields it could read are kept; the others take their defaults, a start or update time the folder's mtime."""
    run_dir = Path(run_dir)
    try:
        data = json_checks.read_object(run_dir / SUMMARY_FILE, MAX_SUMMARY_BYTES)
    except json_checks.Damaged as e:
        data, problems = {}, [f"{SUMMARY_FILE} {e}"]
    else:
        if data is None:
            return None
        problems = json_checks.field_problems(data, _SUMMARY_RULES, required=("model", "status"))
        if problems:
            problems = [f"{SUMMARY_FILE}: {'; '.join(problems)}"]
    fields = {name: data[name] for name, rule in _SUMMARY_RULES.items() if name in data and not rule(data[name])}
    for name in ("final_loss", "eval_loss", "started", "updated"):
        if fields.get(name) is not None:
            fields[name] = float(fields[name])  # an int will do in the file; the summary holds floats
    summary = RunSummary(**{"name": run_dir.name, "model": "", "status": DAMAGED, **fields, "run_dir": str(run_dir)})
    if problems:
        summary.status, summary.reason = DAMAGED, problems[0]
        with contextlib.suppress(OSError):
            mtime = run_dir.stat().st_mtime
            summary.started = fields.get("started", mtime)
            summary.updated = fields.get("updated", mtime)
    return summary


def live_summary(run_dir: Path) -> RunSummary | None:
    """`read_summary`, with a run that says "running" while the process training it is gone (killed, crashed, the
    computer stopped) marked "interrupted"; one whose process this computer cannot check stays "running"."""
    summary = read_summary(run_dir)
    if summary is not None and summary.status == "running" and in_use(run_dir) is False:
        summary.status = INTERRUPTED
        summary.reason = "the process training it ended before the run did"
    return summary


def read_events(run_dir: Path) -> list[events.Event]:
    """Every event of a run in order; a partial last line (the run was killed mid-write) and lines that hold no
    event (`events.from_line`) are skipped (`EventTail` counts them)."""
    return EventTail(run_dir).read()


class EventTail:
    """A run's metrics.jsonl read as another process appends to it: each `read()` returns the events of the complete
    lines added since the last one; a line still being written waits for its end.

    A line that holds no event Hone writes (`events.from_line`: not JSON, an unknown kind, a field of another type, a
    line longer than events.MAX_LINE_BYTES, which is dropped as it comes rather than held) is skipped and counted in
    `skipped`; `skipped_note()` says so for the user.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self._start_over()

    def _start_over(self) -> None:
        self.offset = 0
        self.partial = b""
        self.lines = 0  # complete lines read
        self.skipped = 0  # of them, lines that held no event
        self.first_skipped = ""  # "line 5: why" of the first one
        self._overlong = False  # the line being written passed MAX_LINE_BYTES: its bytes are dropped until its end

    def read(self) -> list[events.Event]:
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                return []  # a FIFO or device would block or never end
            with open(self.path, "rb") as f:
                if f.seek(0, os.SEEK_END) < self.offset:  # rewritten shorter (a resume drops later steps): reread
                    self._start_over()
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []  # not written yet, or gone
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = [event for line in lines if (event := self._event(line)) is not None]
        if len(self.partial) > events.MAX_LINE_BYTES:
            self._overlong = True
        if self._overlong:
            self.partial = b""
        return out

    def _event(self, line: bytes) -> events.Event | None:
        self.lines += 1
        try:
            if self._overlong:
                self._overlong = False
                raise events.EventError(f"a line longer than the {events.MAX_LINE_BYTES:,} bytes any event takes")
            return events.from_line(line)
        except events.EventError as e:
            self.skipped += 1
            self.first_skipped = self.first_skipped or f"line {self.lines}: {e}"
            return None

    def skipped_note(self) -> str:
        """The skipped lines in words for the user, "12 lines of metrics.jsonl could not be read (line 5: why)"; ""
        when every line held an event."""
        if not self.skipped:
            return ""
        lines = "1 line" if self.skipped == 1 else f"{self.skipped:,} lines"
        return f"{lines} of {METRICS_FILE} could not be read ({self.first_skipped})"


def _listed_time(summary: RunSummary) -> float:
    """When a run sorts in the history: its start; a damaged run's, when its folder last changed."""
    if summary.status == DAMAGED:
        with contextlib.suppress(OSError):
            return Path(summary.run_dir).stat().st_mtime
    return summary.started


def list_runs(runs_dir: str | Path) -> list[RunSummary]:
    """Runs under `runs_dir`, newest first; a run whose process was killed shows as "interrupted", one whose run.json
    cannot be read as "damaged" (`read_summary`)."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        return []
    runs = [s for d in root.iterdir() if d.is_dir() and (s := live_summary(d)) is not None]
    return sorted(runs, key=_listed_time, reverse=True)

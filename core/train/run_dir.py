"""Run folders: one per run, holding everything needed to follow, resume and export it.

`RunWriter` writes config.toml, metrics.jsonl, train.log and run.json as a run goes (what each holds is beside its
name below), holding the folder's lock (run_lock.py) while it is open; checkpoints.py and adapter_dir.py write the
rest. Stdlib only, so the GUI's run history can read folders without torch.

Every JSON file here is strict JSON: a number that is not finite (a loss that became NaN) is written as null, and
`read_events` gives it back as NaN.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import HoneError
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
# train.log gets a step line at most this often (and always for the first and last step): every step of a slow run,
# a readable trace of a fast one; metrics.jsonl keeps every step.
LOG_STEP_EVERY_S = 10.0


@dataclass
class RunSummary:
    """What the run history shows for one run (from run.json)."""

    run_dir: str
    name: str
    model: str
    status: str  # running | finished | stopped | failed; read back, also interrupted (live_summary)
    step: int = 0
    total_steps: int = 0
    final_loss: float | None = None
    eval_loss: float | None = None
    started: float = 0.0
    updated: float = 0.0
    reason: str = ""  # why it failed

    @property
    def has_adapter(self) -> bool:
        return (Path(self.run_dir) / ADAPTER_DIR / "adapter_config.json").is_file()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


def new_run_dir(config: RunConfig) -> Path:
    """A fresh folder under output.runs_dir: output.name, or date-time plus model name; never reuses a folder."""
    root = Path(config.output.runs_dir).expanduser()
    model = Path(config.model.name_or_path.replace(":", "/")).name
    base = config.output.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(model)}"
    candidate, n = root / base, 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate, n = root / f"{base}-{n}", n + 1
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
            s.status, s.reason = "failed", event.reason
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
            except ValueError:
                continue
            if data.get("event") in _STEP_EVENTS and (data.get("step") or 0) > step:
                continue
            if data.get("event") == "StepMetrics" and data.get("step") == step:
                self.last_loss = float("nan") if data.get("loss") is None else data["loss"]
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


def read_summary(run_dir: Path) -> RunSummary | None:
    path = Path(run_dir) / SUMMARY_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    names = RunSummary.__dataclass_fields__
    summary = RunSummary(**{k: v for k, v in data.items() if k in names})
    summary.run_dir = str(Path(run_dir))
    return summary


def live_summary(run_dir: Path) -> RunSummary | None:
    """`read_summary`, with a run that says "running" while the process training it is gone (killed, crashed, the
    computer stopped) marked "interrupted"; one whose process this computer cannot check stays "running"."""
    summary = read_summary(run_dir)
    if summary is not None and summary.status == "running" and in_use(run_dir) is False:
        summary.status = INTERRUPTED
        summary.reason = "the process training it ended before the run did"
    return summary


def _nan_for_null(event: events.Event) -> events.Event:
    """A float field written as null (it was not finite) read back as NaN, so it stays a float."""
    nulls = {
        f.name: math.nan for f in dataclasses.fields(event) if f.type == "float" and getattr(event, f.name) is None
    }
    return dataclasses.replace(event, **nulls) if nulls else event


def read_events(run_dir: Path) -> list[events.Event]:
    """Every event of a run in order; a partial last line (the run was killed mid-write) is skipped."""
    return EventTail(run_dir).read()


class EventTail:
    """A run's metrics.jsonl read as another process appends to it: each `read()` returns the events of the complete
    lines added since the last one; a line still being written waits for its end."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.offset = 0
        self.partial = b""

    def read(self) -> list[events.Event]:
        try:
            with open(self.path, "rb") as f:
                if f.seek(0, os.SEEK_END) < self.offset:  # rewritten shorter (a resume drops later steps): reread
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []  # not written yet, or gone
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(_nan_for_null(events.from_dict(json.loads(line))))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                continue
        return out


def list_runs(runs_dir: str | Path) -> list[RunSummary]:
    """Runs under `runs_dir`, newest first; a run whose process was killed shows as "interrupted"."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        return []
    runs = [s for d in root.iterdir() if d.is_dir() and (s := live_summary(d)) is not None]
    return sorted(runs, key=lambda s: s.started, reverse=True)

"""Run folders: one per run, holding everything needed to follow, resume and export it.

`RunWriter` writes config.toml, metrics.jsonl, train.log and run.json as a run goes, holding the folder's lock
(run_lock.py) while it is open; checkpoints.py and adapter_dir.py write the rest. The run folder's parts have
modules of their own, whose names this module re-exports:

    run_layout.py   what the folder holds, by name (what each file holds is beside its name), and a new folder
    run_log.py      train.log's lines, one per event
    safe_writes.py  atomic JSON, append-only line files, the disk-full error
    run_history.py  a folder read back: run.json checked, events, the list of runs

Stdlib only, so the GUI's run history can read folders without torch. Every JSON file here is strict JSON: a number
that is not finite (a loss that became NaN) is written as null, and `read_events` gives it back as NaN.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.run_history import (  # noqa: F401  (re-exported)
    MAX_SUMMARY_BYTES,
    EventTail,
    list_runs,
    live_summary,
    read_events,
    read_summary,
)
from hone.core.train.run_layout import (  # noqa: F401  (re-exported)
    ADAPTER_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    DAMAGED,
    INTERRUPTED,
    LOG_FILE,
    METRICS_FILE,
    STATUSES,
    SUMMARY_FILE,
    RunSummary,
    check_run_path,
    new_run_dir,
)
from hone.core.train.run_lock import RunLock
from hone.core.train.run_log import log_lines, speed_choice, step_line  # noqa: F401  (re-exported)
from hone.core.train.safe_writes import (
    LineFile,
    disk_full_error,
    is_disk_full,
    json_safe,
    replace_with,
    whole_lines_size,
    write_json_atomic,
)

# train.log gets a step line at most this often (and always for the first and last step): every step of a slow run,
# a readable trace of a fast one; metrics.jsonl keeps every step.
LOG_STEP_EVERY_S = 10.0


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
            self._metrics = LineFile(self.run_dir / METRICS_FILE, cut_partial=True)
            self._log = LineFile(self.run_dir / LOG_FILE, cut_partial=False)
            if self._log.size and whole_lines_size(self.run_dir / LOG_FILE, self._log.size) < self._log.size:
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
            self._metrics = LineFile(path, cut_partial=False)
            self._attempt_start = self._metrics.size - len(this_attempt)

    def close(self) -> None:
        """Close the files and give the lock back; a folder made for a run that never started is removed."""
        self._metrics.close()
        self._log.close()
        self._lock.release()
        if not self._keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)

"""A run folder read back: run.json checked field by field, a run whose process is gone marked interrupted, the
events of metrics.jsonl (also while another process appends to it), and the runs under a folder, newest first.

Never raises on what it reads: a damaged file becomes a "damaged" run or a skipped, counted line. Stdlib only, so
the Studio's run history reads folders without torch.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from hone.core import events
from hone.core.train import json_checks
from hone.core.train.run_layout import DAMAGED, INTERRUPTED, METRICS_FILE, STATUSES, SUMMARY_FILE, RunSummary
from hone.core.train.run_lock import in_use

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

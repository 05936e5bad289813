"""Run folders: one per run, holding everything needed to follow, resume and export it.

`RunWriter` writes config.toml, metrics.jsonl, train.log and run.json as a run goes (what each holds is beside its
name below); checkpoints.py and adapter_dir.py write the rest. Stdlib only, so the GUI's run history can read
folders without torch.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig

# What RUN_DIR holds:
CONFIG_FILE = "config.toml"  # the RunConfig the run used
# Every event, one JSON object per line; append-only, so a killed run loses at most its last partial line, which
# readers skip.
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"  # human-readable log: the run's setup, steps, evals, checkpoints, the outcome (`log_lines`)
SUMMARY_FILE = "run.json"  # summary: status, steps, losses, paths (rewritten atomically)
ADAPTER_DIR = "adapter"  # the final PEFT adapter folder (adapter_dir.py)
CHECKPOINTS_DIR = "checkpoints"  # step-NNNNNN/ resumable states (checkpoints.py)
# train.log gets a step line at most this often (and always for the first and last step): every step of a slow run,
# a readable trace of a fast one; metrics.jsonl keeps every step.
LOG_STEP_EVERY_S = 10.0


@dataclass
class RunSummary:
    """What the run history shows for one run (from run.json)."""

    run_dir: str
    name: str
    model: str
    status: str  # running | finished | stopped | failed
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
    line = (f"step {event.step}/{event.total_steps}  loss {event.loss:.4f}  lr {event.lr:.2e}  "
            f"{event.tokens_per_s:,.0f} tok/s")
    if event.mem_allocated:
        line += f"  {event.mem_allocated / 2**30:.1f} GiB"
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
        lines = [f"{event.split} data {', '.join(event.files)}: {event.rows_read:,} rows read, {event.rows_kept:,} "
                 f"kept, {skipped:,} skipped{f' ({reasons})' if reasons else ''}; {event.tokens:,} tokens, "
                 f"{event.trained_tokens:,} trained"]
        lines += [f"  skipped {m}" for m in event.skipped_examples]
        if skipped > len(event.skipped_examples):
            lines.append(f"  ... {skipped - len(event.skipped_examples):,} more: `hone data check` lists every one")
        return lines + [f"  source not read: {m}" for m in event.problems] + [f"  note: {n}" for n in event.notes]
    if isinstance(event, events.Notice):
        return [f"{'warning' if event.level == 'warning' else 'note'}: {event.topic}: {event.message}"]
    if isinstance(event, events.RunStarted):
        what = f"resumed from step {event.resumed_from_step}" if event.resumed_from_step else "started"
        lines = [f"{what}: {event.model} on {event.device} ({event.dtype}), {event.total_steps} steps, "
                 f"{event.params_trainable:,} of {event.params_total:,} parameters trained, "
                 f"{event.tokens_per_epoch:,} tokens per epoch"]
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
        eval_part = f", eval loss {event.eval_loss:.4f}" if event.eval_loss is not None else ""
        return [f"{'stopped' if event.stopped else 'finished'} after {event.step} steps in {event.elapsed:.0f} s: "
                f"final loss {event.final_loss:.4f}{eval_part}; adapter {event.adapter_dir}"]
    if isinstance(event, events.RunFailed):
        lines = [f"failed at step {event.step}: {event.reason}"]
        if event.advice:
            lines.append(f"  advice: {event.advice}")
        return lines + [f"  {line}" for line in event.details.rstrip().splitlines()]
    return []


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunWriter:
    """Appends events to metrics.jsonl, lines to train.log, and keeps run.json current."""

    def __init__(self, run_dir: Path, config: RunConfig):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (self.run_dir / CONFIG_FILE).exists():
            config.save(self.run_dir / CONFIG_FILE)
        self._metrics = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self._log = open(self.run_dir / LOG_FILE, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        previous = read_summary(self.run_dir)
        self.summary = previous or RunSummary(run_dir=str(self.run_dir), name=self.run_dir.name,
                                              model=config.model.name_or_path, status="running",
                                              started=time.time())
        self.summary.status = "running"
        self.summary.reason = ""
        self._last_step_logged = 0.0

    def log(self, text: str) -> None:
        self._log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self._log.flush()

    def write(self, event: events.Event) -> None:
        """Append the event to metrics.jsonl and, in words, to train.log; keep run.json current."""
        self._metrics.write(json.dumps(events.to_dict(event)) + "\n")
        self._metrics.flush()
        throttled = False
        if isinstance(event, events.StepMetrics):
            now = time.monotonic()
            throttled = (event.step > 1 and event.step != event.total_steps
                         and now - self._last_step_logged < LOG_STEP_EVERY_S)
            if not throttled:
                self._last_step_logged = now
        if not throttled:
            for line in log_lines(event):
                self.log(line)
        self._update_summary(event)

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

    def close(self) -> None:
        self._metrics.close()
        self._log.close()


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


def read_events(run_dir: Path) -> list[events.Event]:
    """Every event of a run in order; a partial last line (the run was killed mid-write) is skipped."""
    out = []
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(events.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return out


def list_runs(runs_dir: str | Path) -> list[RunSummary]:
    """Runs under `runs_dir`, newest first. A run killed while running still shows, as status 'running'."""
    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        return []
    runs = [s for d in root.iterdir() if d.is_dir() and (s := read_summary(d)) is not None]
    return sorted(runs, key=lambda s: s.started, reverse=True)

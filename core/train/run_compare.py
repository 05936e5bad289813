"""Runs compared: the settings that differ between run folders, each run's numbers, and its chart columns.

Settings come from each run's config.toml (every key, defaults filled in, flattened to `section.key`); numbers and
chart columns from its metrics.jsonl events (read as the run history reads them: a line that holds no event is
skipped and counted) and its run.json status (a run.json that cannot be read says "damaged" and why). A run folder
with a damaged file is still compared as far as its other files allow; only a folder that is no run at all is
refused (`read_run`), or, for the Studio, shown with that problem alone (`compare_runs`).

`hone compare` prints it and the Studio's Runs page draws it; both word the numbers with `metric_text` and
`setting_text`, so the two say the same. Stdlib only: the Studio reads folders without torch or numpy (the columns are
`array.array`s, which numpy reads without a copy).
"""

from __future__ import annotations

import json
import math
import statistics
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.events import EvalMetrics, RunFinished, StepMetrics
from hone.core.train.run_history import EventTail, live_summary
from hone.core.train.run_layout import CONFIG_FILE, DAMAGED, METRICS_FILE, SUMMARY_FILE

# Keys that differ between any two runs without saying how they trained: the folder's name and place.
NOT_SETTINGS = ("output.name", "output.runs_dir")
GIB = 1024**3
METRIC_COLUMNS = (  # (key in RunNumbers.metrics, column header)
    ("status", "status"),
    ("steps", "steps"),
    ("final_train_loss", "final loss"),
    ("final_eval_loss", "final eval"),
    ("best_eval_loss", "best eval"),
    ("best_eval_step", "best at"),
    ("median_tokens_per_s", "median tok/s"),
    ("peak_mem_allocated", "peak GiB"),
    ("wall_time_s", "wall time"),
)
NOT_A_RUN = "not a run"  # the status `compare_runs` gives a folder that holds no run (deleted since it was listed)


def _ints() -> array:
    return array("q")


def _floats() -> array:
    return array("d")


@dataclass
class RunSeries:
    """A run's chart columns from metrics.jsonl, in the file's order (each step once: a resume drops the lines of the
    steps it trains again). Step columns have one entry per StepMetrics, eval columns one per EvalMetrics.

    Attributes:
        step: int64, the optimizer step.
        tokens_seen: int64, real (non-padding) tokens trained on through this step: StepMetrics.tokens summed.
        loss: float64, the step's training loss (NaN where the run's loss became NaN).
        tokens_per_s: float64, the step's speed.
        mem_allocated: int64, bytes of GPU memory allocated at the step's peak; 0 where none was reported (the CPU).
        eval_step: int64, the step each evaluation followed.
        eval_tokens_seen: int64, tokens seen through that step (0 for an evaluation before the first step).
        eval_loss: float64, the evaluation's mean loss.
    """

    step: array = field(default_factory=_ints)
    tokens_seen: array = field(default_factory=_ints)
    loss: array = field(default_factory=_floats)
    tokens_per_s: array = field(default_factory=_floats)
    mem_allocated: array = field(default_factory=_ints)
    eval_step: array = field(default_factory=_ints)
    eval_tokens_seen: array = field(default_factory=_ints)
    eval_loss: array = field(default_factory=_floats)

    @classmethod
    def of(cls, steps: list[StepMetrics], evals: list[EvalMetrics]) -> RunSeries:
        """The columns of a run's step and eval events, each list in the file's order."""
        series = cls()
        seen = 0
        for event in steps:
            seen += event.tokens
            series.step.append(event.step)
            series.tokens_seen.append(seen)
            series.loss.append(event.loss)
            series.tokens_per_s.append(event.tokens_per_s)
            series.mem_allocated.append(event.mem_allocated)
        for evaluation in evals:
            before = bisect_right(series.step, evaluation.step)  # steps run in order: the last one at or before it
            series.eval_step.append(evaluation.step)
            series.eval_tokens_seen.append(series.tokens_seen[before - 1] if before else 0)
            series.eval_loss.append(evaluation.loss)
        return series


@dataclass
class RunNumbers:
    """One run as compared: its flattened settings and its numbers; `problems` says what could not be read."""

    run_dir: str
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    series: RunSeries = field(default_factory=RunSeries)


@dataclass
class RunComparison:
    """Runs side by side, as the Studio shows them: `runs` in the order asked, `differing` each setting whose value
    is not the same in every run (`differing_settings`: one value per run)."""

    runs: list[RunNumbers]
    differing: dict[str, list[Any]]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1e-4}} -> {"train.lr": 1e-4}; lists and other values are leaves."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _read_metrics(run_dir: Path) -> tuple[dict[str, Any], list[str], RunSeries]:
    """A run's numbers and chart columns from its metrics.jsonl and run.json, and what could not be read."""
    problems: list[str] = []
    summary = live_summary(run_dir)
    status = summary.status if summary is not None else "unknown"
    if summary is not None and summary.status == DAMAGED:
        problems.append(f"{summary.reason}; {summary.advice}")
    elif summary is None:
        problems.append(f"{run_dir / SUMMARY_FILE} is missing: status unknown")
    tail = EventTail(run_dir)
    steps: list[StepMetrics] = []
    evals: list[EvalMetrics] = []
    finished = None
    for event in tail.read():
        if isinstance(event, StepMetrics):
            steps.append(event)
        elif isinstance(event, EvalMetrics):
            evals.append(event)
        elif isinstance(event, RunFinished):
            finished = event
    if tail.skipped:
        problems.append(f"{run_dir}: {tail.skipped_note()}: damaged lines left out")
    if not steps:
        problems.append(f"{run_dir / METRICS_FILE} holds no step")
    speeds = [e.tokens_per_s for e in steps if math.isfinite(e.tokens_per_s) and e.tokens_per_s > 0]
    memory = [e.mem_allocated for e in steps if e.mem_allocated > 0]
    scored = [e for e in evals if math.isfinite(e.loss)]
    best = min(scored, key=lambda e: e.loss) if scored else None
    elapsed = finished.elapsed if finished is not None else (steps[-1].elapsed if steps else None)
    metrics = {
        "status": status,
        "steps": steps[-1].step if steps else 0,
        "total_steps": steps[-1].total_steps if steps else (summary.total_steps if summary else 0),
        "final_train_loss": _finite(steps[-1].loss) if steps else None,
        "final_eval_loss": _finite(evals[-1].loss) if evals else None,
        "best_eval_loss": best.loss if best else None,
        "best_eval_step": best.step if best else None,
        "median_tokens_per_s": statistics.median(speeds) if speeds else None,
        "peak_mem_allocated": max(memory) if memory else None,
        "peak_mem_reserved": max((e.mem_reserved for e in steps), default=0) or None,
        "wall_time_s": elapsed,
    }
    return metrics, problems, RunSeries.of(steps, evals)


def metrics_of(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A run's numbers from its metrics.jsonl and run.json, and what could not be read (file and why)."""
    metrics, problems, _series = _read_metrics(Path(run_dir))
    return metrics, problems


def read_run(run_dir: Path) -> RunNumbers:
    """One run folder's settings, numbers and chart columns. Raises HoneError only for a folder that is no run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any((run_dir / f).exists() for f in (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE)):
        raise HoneError(
            f"{run_dir} is not a run folder (no {CONFIG_FILE}, {METRICS_FILE} or {SUMMARY_FILE})",
            "give folders `hone train` wrote, e.g. runs/NAME",
        )
    run = RunNumbers(str(run_dir), run_dir.name)
    try:
        run.settings = {
            k: v for k, v in flatten(RunConfig.load(run_dir / CONFIG_FILE).to_dict()).items() if k not in NOT_SETTINGS
        }
    except HoneError as e:  # a damaged config.toml: its settings are left out, its numbers still shown
        run.problems.append(f"{e.message}: settings left out" + (f" ({e.advice})" if e.advice else ""))
    run.metrics, problems, run.series = _read_metrics(run_dir)
    run.problems += problems
    return run


def differing_settings(runs: list[RunNumbers]) -> dict[str, list[Any]]:
    """Each setting whose value is not the same in every run whose config.toml could be read, with the value of
    each run in order (None where a run's config could not be read)."""
    readable = [r for r in runs if r.settings]
    keys = sorted({k for r in readable for k in r.settings})
    out = {}
    for key in keys:
        values = [r.settings.get(key) for r in readable]
        if any(v != values[0] for v in values[1:]):
            out[key] = [r.settings.get(key) if r.settings else None for r in runs]
    return out


def unique_names(runs: list[RunNumbers]) -> None:
    """Folder names as column headers; the whole path where two runs share a name (set in place)."""
    seen = [r.name for r in runs]
    for run in runs:
        if seen.count(run.name) > 1:
            run.name = run.run_dir


def compare_runs(run_dirs: list[str | Path]) -> RunComparison:
    """The Studio's comparison of `run_dirs`: each folder read (`read_run`), names made unique. Never raises on what
    it reads: a folder that is no run (deleted since it was listed) is compared with status NOT_A_RUN and that
    problem, and no numbers."""
    runs = []
    for run_dir in run_dirs:
        try:
            runs.append(read_run(Path(run_dir)))
        except HoneError as e:
            name = Path(run_dir).name
            runs.append(RunNumbers(str(run_dir), name, metrics={"status": NOT_A_RUN}, problems=[e.message]))
    unique_names(runs)
    return RunComparison(runs, differing_settings(runs))


def setting_text(value: Any) -> str:
    """A setting's value as the comparison shows it: "—" for none, 4 significant digits, thousands separated."""
    if value is None:
        return "—"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value)


def metric_text(key: str, metrics: dict[str, Any]) -> str:
    """The number `metrics[key]` (a key of METRIC_COLUMNS) in words: steps as "done/total", memory in GiB, wall time
    as seconds or h:mm:ss, losses with 4 decimals; "—" where the run has none."""
    value = metrics.get(key)
    if value is None:
        return "—"
    if key == "steps":
        return f"{value:,}/{metrics['total_steps']:,}" if metrics.get("total_steps") else f"{value:,}"
    if key == "median_tokens_per_s":
        return f"{value:,.0f}"
    if key == "peak_mem_allocated":
        return f"{value / GIB:.2f}"
    if key == "wall_time_s":
        if value < 60:
            return f"{value:.1f} s"
        minutes, seconds = divmod(round(value), 60)
        return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}" if minutes >= 60 else f"{minutes}:{seconds:02d}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def comparison(runs: list[RunNumbers]) -> dict[str, Any]:
    """The comparison as JSON-ready data: runs in order, the settings that differ (one value per run), the
    problems met."""
    return _json_safe(
        {
            "runs": [
                {"run_dir": r.run_dir, "name": r.name, "metrics": r.metrics, "problems": r.problems} for r in runs
            ],
            "differing_settings": differing_settings(runs),
        }
    )

"""`hone compare RUN RUN… [--json OUT]`: the settings that differ between runs, and each run's numbers.

Settings come from each run's config.toml (every key, defaults filled in, flattened to `section.key`); numbers from
its metrics.jsonl events (read as the run history reads them: a line that holds no event is skipped and counted) and
its run.json status (a run.json that cannot be read says "damaged" and why). A run folder with a damaged file is
still compared as far as its other files allow; only a folder that is no run at all is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError

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


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="the settings that differ between runs, and their losses, speed and memory",
        description="Compare run folders: a table of only the settings that differ (from each run's "
        "config.toml) and a table of each run's numbers from its metrics.jsonl: final and best eval loss, "
        "final train loss, median tokens/s, peak GPU memory, wall time, steps and status.\n\n"
        "exit codes: 0 done, 2 bad input (fewer than two runs, a folder that is no run)",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders `hone train` wrote (two or more)")
    p.add_argument("--json", metavar="OUT", help="also write the comparison as JSON to OUT")
    return p


@dataclass
class RunNumbers:
    """One run as compared: its flattened settings and its numbers; `problems` says what could not be read."""

    run_dir: str
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


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


def metrics_of(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A run's numbers from its metrics.jsonl and run.json, and what could not be read (file and why)."""
    from hone.core.api import DAMAGED, EventTail, live_summary
    from hone.core.events import EvalMetrics, RunFinished, StepMetrics

    problems: list[str] = []
    summary = live_summary(run_dir)
    status = summary.status if summary is not None else "unknown"
    if summary is not None and summary.status == DAMAGED:
        problems.append(f"{summary.reason}; {summary.advice}")
    elif summary is None:
        problems.append(f"{run_dir / 'run.json'} is missing: status unknown")
    tail = EventTail(run_dir)
    steps, evals, finished = [], [], None
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
        problems.append(f"{run_dir / 'metrics.jsonl'} holds no step")
    speeds = [e.tokens_per_s for e in steps if math.isfinite(e.tokens_per_s) and e.tokens_per_s > 0]
    memory = [e.mem_allocated for e in steps if e.mem_allocated > 0]
    scored = [e for e in evals if math.isfinite(e.loss)]
    best = min(scored, key=lambda e: e.loss) if scored else None
    elapsed = finished.elapsed if finished is not None else (steps[-1].elapsed if steps else None)
    return {
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
    }, problems


def read_run(run_dir: Path) -> RunNumbers:
    """One run folder's settings and numbers. Raises HoneError only for a folder that is no run."""
    from hone.core.api import CONFIG_FILE, METRICS_FILE
    from hone.core.config import RunConfig

    if not run_dir.is_dir() or not any((run_dir / f).exists() for f in (CONFIG_FILE, METRICS_FILE, "run.json")):
        raise HoneError(
            f"{run_dir} is not a run folder (no {CONFIG_FILE}, {METRICS_FILE} or run.json)",
            "give folders `hone train` wrote, e.g. runs/NAME",
        )
    run = RunNumbers(str(run_dir), run_dir.name)
    try:
        run.settings = {
            k: v for k, v in flatten(RunConfig.load(run_dir / CONFIG_FILE).to_dict()).items() if k not in NOT_SETTINGS
        }
    except HoneError as e:  # a damaged config.toml: its settings are left out, its numbers still shown
        run.problems.append(f"{e.message}: settings left out" + (f" ({e.advice})" if e.advice else ""))
    run.metrics, problems = metrics_of(run_dir)
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


def _names(runs: list[RunNumbers]) -> None:
    """Folder names as column headers; the whole path where two runs share a name."""
    seen = [r.name for r in runs]
    for run in runs:
        if seen.count(run.name) > 1:
            run.name = run.run_dir


def _shown(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value)


def _metric(key: str, value: Any, metrics: dict[str, Any]) -> str:
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


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if len(args.runs) < 2:
        raise HoneError("hone compare needs two or more run folders", "give them all: hone compare runs/a runs/b")
    runs = [read_run(Path(r)) for r in args.runs]
    _names(runs)
    console = Console()
    differing = differing_settings(runs)
    if differing:
        table = Table(title="settings that differ", show_edge=False, header_style="bold")
        table.add_column("setting")
        for r in runs:
            table.add_column(escape(r.name))
        for key, values in differing.items():
            table.add_row(key, *(escape(_shown(v)) for v in values))
        console.print(table)
    else:
        console.print("[dim]every setting is the same in these runs[/]")
    table = Table(title="numbers", show_edge=False, header_style="bold")
    table.add_column("run")
    for key, header in METRIC_COLUMNS:
        table.add_column(header, justify="left" if key == "status" else "right")
    for r in runs:
        status = r.metrics["status"]
        style = {"finished": "green", "failed": "red", "damaged": "red"}.get(status, "yellow")
        cells = [f"[{style}]{escape(status)}[/]"]
        cells += [_metric(key, r.metrics.get(key), r.metrics) for key, _ in METRIC_COLUMNS[1:]]
        table.add_row(escape(r.name), *cells)
    console.print(table)
    for r in runs:
        for problem in r.problems:
            console.print(f"[yellow]{escape(r.name)}: {escape(problem)}[/]")
    if args.json:
        out = Path(args.json)
        try:
            out.write_text(json.dumps(comparison(runs), indent=2, allow_nan=False) + "\n", encoding="utf-8")
        except OSError as e:
            raise HoneError(f"--json {out} cannot be written: {e.strerror or e}", "give a writable path") from None
        console.print(f"[dim]written to {escape(str(out))}[/]")
    return 0

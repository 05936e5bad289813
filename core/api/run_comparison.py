"""Runs side by side: the settings that differ, each run's numbers and its chart columns (`hone compare`, the Runs
page's Compare).

    read       read_run(run_dir) -> RunNumbers (settings, metrics, problems, series); metrics_of(run_dir);
               compare_runs([run_dir, ...]) -> RunComparison (the Studio's: a folder that is no run is shown with
               status NOT_A_RUN rather than refused); RunSeries (a run's chart columns)
    compare    differing_settings(runs), comparison(runs) (JSON-ready), unique_names(runs), NOT_SETTINGS
    in words   METRIC_COLUMNS, metric_text(key, metrics), setting_text(value)
    scores     each run's best checkpoint by held-out loss, read from its scores.json (no torch), among its numbers

Light to import: stdlib only, no torch, no numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hone.core.errors import HoneError
from hone.core.inference.score_store import DEFAULT_METRIC, best_stored
from hone.core.train import run_compare
from hone.core.train.run_compare import (
    NOT_A_RUN,
    NOT_SETTINGS,
    RunComparison,
    RunNumbers,
    RunSeries,
    comparison,
    differing_settings,
    setting_text,
    unique_names,
)

# The training numbers, then the best checkpoint by held-out loss as scores.json stores it (`hone eval --checkpoints`,
# train.eval_checkpoints): its step ("best_checkpoint") and loss ("best_checkpoint_loss"), None for an unscored run.
METRIC_COLUMNS = (*run_compare.METRIC_COLUMNS, ("best_checkpoint", "best checkpoint"))


def read_run(run_dir: Path) -> RunNumbers:
    """`run_compare.read_run` with the run's best scored checkpoint among its numbers."""
    run = run_compare.read_run(run_dir)
    _add_scores(run)
    return run


def metrics_of(run_dir: str | Path) -> tuple[dict[str, Any], list[str]]:
    """`run_compare.metrics_of` with the run's best scored checkpoint among its numbers, as `read_run` has them."""
    run = RunNumbers(str(run_dir), Path(run_dir).name)
    run.metrics, run.problems = run_compare.metrics_of(Path(run_dir))
    _add_scores(run)
    return run.metrics, run.problems


def compare_runs(run_dirs: list[str | Path]) -> RunComparison:
    """`run_compare.compare_runs` with each run's best scored checkpoint among its numbers."""
    result = run_compare.compare_runs(run_dirs)
    for run in result.runs:
        if run.metrics.get("status") != NOT_A_RUN:
            _add_scores(run)
    return result


def metric_text(key: str, metrics: dict[str, Any]) -> str:
    """`run_compare.metric_text`, and the best checkpoint as "step 20 · loss 1.2345" ("—" where none is scored)."""
    if key != "best_checkpoint":
        return run_compare.metric_text(key, metrics)
    step, loss = metrics.get("best_checkpoint"), metrics.get("best_checkpoint_loss")
    if step is None:
        return "—"
    return f"step {step:,}" + (f" · loss {loss:.4f}" if isinstance(loss, float) else "")


def _add_scores(run: RunNumbers) -> None:
    """The best checkpoint still in the folder by DEFAULT_METRIC, on the data scored last; a damaged scores.json is
    one of the run's problems, no scores none."""
    from hone.core.inference.score_store import read_scores

    run.metrics["best_checkpoint"] = run.metrics["best_checkpoint_loss"] = None
    damage = read_scores(run.run_dir).damage
    if damage:
        run.problems.append(f"{damage}: no checkpoint scores shown (hone eval RUN --checkpoints all scores them again)")
        return
    try:
        best = best_stored(run.run_dir, DEFAULT_METRIC)
    except HoneError:  # nothing scored (or not on this metric): the column says "—"
        return
    run.metrics["best_checkpoint"] = best.checkpoint
    run.metrics["best_checkpoint_loss"] = best.metrics.get(DEFAULT_METRIC)


__all__ = [
    "METRIC_COLUMNS",
    "NOT_A_RUN",
    "NOT_SETTINGS",
    "RunComparison",
    "RunNumbers",
    "RunSeries",
    "compare_runs",
    "comparison",
    "differing_settings",
    "metric_text",
    "metrics_of",
    "read_run",
    "setting_text",
    "unique_names",
]

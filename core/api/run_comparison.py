"""Runs side by side: the settings that differ, each run's numbers and its chart columns (`hone compare`, the Runs
page's Compare).

    read       read_run(run_dir) -> RunNumbers (settings, metrics, problems, series); metrics_of(run_dir);
               compare_runs([run_dir, ...]) -> RunComparison (the Studio's: a folder that is no run is shown with
               status NOT_A_RUN rather than refused); RunSeries (a run's chart columns)
    compare    differing_settings(runs), comparison(runs) (JSON-ready), unique_names(runs), NOT_SETTINGS
    in words   METRIC_COLUMNS, metric_text(key, metrics), setting_text(value)

Light to import: stdlib only, no torch, no numpy.
"""

from __future__ import annotations

from hone.core.train.run_compare import (
    METRIC_COLUMNS,
    NOT_A_RUN,
    NOT_SETTINGS,
    RunComparison,
    RunNumbers,
    RunSeries,
    compare_runs,
    comparison,
    differing_settings,
    metric_text,
    metrics_of,
    read_run,
    setting_text,
    unique_names,
)

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

"""Runs compared in the engine (hone.core.api: read_run, compare_runs, RunSeries): chart columns from metrics.jsonl,
a folder that went away shown rather than refused, and the numbers in the words `hone compare` and the Studio share.
Folders are written line by line here, so every expected value comes from the lists they were written from."""

from __future__ import annotations

import json
import math
from itertools import accumulate

from hone.core.api import NOT_A_RUN, RunSeries, compare_runs, metric_text, metrics_of, read_run, setting_text
from hone.core.config import RunConfig
from hone.core.events import EvalMetrics, StepMetrics, to_dict

GIB = 1024**3


def _step(step: int, loss: float, tokens: int, speed: float = 100.0, memory: int = 0) -> StepMetrics:
    return StepMetrics(
        step=step,
        total_steps=4,
        epoch=step / 4,
        loss=loss,
        lr=1e-4,
        grad_norm=1.0,
        tokens=tokens,
        trained_tokens=tokens,
        tokens_per_s=speed,
        step_time=0.1,
        elapsed=float(step),
        mem_allocated=memory,
    )


def _folder(path, events, lr: float = 1e-4):
    path.mkdir(parents=True)
    config = RunConfig()
    config.train.lr = lr
    config.save(path / "config.toml")
    text = "".join(json.dumps(to_dict(e)) + "\n" for e in events).replace("NaN", "null")
    (path / "metrics.jsonl").write_text(text, encoding="utf-8")
    return path


def test_series_hold_each_step_tokens_seen_and_evaluations_at_the_tokens_seen_by_then():
    tokens = [30, 50, 20, 40]
    steps = [_step(s, 4.0 - s, t, 10.0 * s, s * GIB) for s, t in enumerate(tokens, 1)]
    evals = [EvalMetrics(step=0, loss=5.0, tokens=8), EvalMetrics(step=2, loss=2.5, tokens=8)]
    evals.append(EvalMetrics(step=4, loss=1.5, tokens=8))
    series = RunSeries.of(steps, evals)
    assert list(series.step) == [1, 2, 3, 4]
    assert list(series.tokens_seen) == list(accumulate(tokens)) == [30, 80, 100, 140]
    assert list(series.loss) == [3.0, 2.0, 1.0, 0.0]
    assert list(series.tokens_per_s) == [10.0, 20.0, 30.0, 40.0]
    assert list(series.mem_allocated) == [GIB, 2 * GIB, 3 * GIB, 4 * GIB]
    assert list(series.eval_step) == [0, 2, 4]
    assert list(series.eval_tokens_seen) == [0, 80, 140]  # before step 1 nothing was seen
    assert list(series.eval_loss) == [5.0, 2.5, 1.5]


def test_read_run_reads_series_and_numbers_past_a_damaged_line(tmp_path):
    events = [_step(1, 2.0, 10), EvalMetrics(step=1, loss=1.9, tokens=4), _step(2, float("nan"), 20)]
    run_dir = _folder(tmp_path / "r", events)
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("{not json\n")
    run = read_run(run_dir)
    assert list(run.series.step) == [1, 2] and list(run.series.tokens_seen) == [10, 30]
    assert run.series.loss[0] == 2.0 and math.isnan(run.series.loss[1])  # null in the file: NaN, as written
    assert list(run.series.eval_tokens_seen) == [10]
    assert run.metrics["final_train_loss"] is None and run.metrics["best_eval_loss"] == 1.9
    assert any("1 line of metrics.jsonl could not be read (line 4" in p for p in run.problems)
    assert any("run.json is missing" in p for p in run.problems)
    assert metrics_of(run_dir) == (run.metrics, run.problems)


def test_compare_runs_shows_a_folder_that_is_no_run_and_compares_the_rest(tmp_path):
    a = _folder(tmp_path / "a", [_step(1, 2.0, 10)], lr=1e-4)
    b = _folder(tmp_path / "b", [_step(1, 1.0, 10)], lr=2e-4)
    gone = tmp_path / "gone"
    got = compare_runs([a, gone, b])
    assert [r.name for r in got.runs] == ["a", "gone", "b"]
    assert got.runs[1].metrics == {"status": NOT_A_RUN}
    assert got.runs[1].problems == [f"{gone} is not a run folder (no config.toml, metrics.jsonl or run.json)"]
    assert got.differing == {"train.lr": [1e-4, None, 2e-4]}
    assert [metric_text(key, got.runs[1].metrics) for key in ("steps", "final_train_loss")] == ["—", "—"]


def test_two_runs_of_one_name_are_told_apart_by_their_paths(tmp_path):
    a = _folder(tmp_path / "x" / "run", [_step(1, 2.0, 10)])
    b = _folder(tmp_path / "y" / "run", [_step(1, 1.0, 10)])
    assert [r.name for r in compare_runs([a, b]).runs] == [str(a), str(b)]


def test_numbers_and_settings_in_words():
    metrics = {"steps": 1234, "total_steps": 2000, "peak_mem_allocated": 3 * GIB // 2, "median_tokens_per_s": 9876.4}
    assert metric_text("steps", metrics) == "1,234/2,000"
    assert metric_text("peak_mem_allocated", metrics) == "1.50"
    assert metric_text("median_tokens_per_s", metrics) == "9,876"
    assert [metric_text("wall_time_s", {"wall_time_s": s}) for s in (59.94, 61, 3725)] == ["59.9 s", "1:01", "1:02:05"]
    assert metric_text("final_eval_loss", {"final_eval_loss": 0.123456}) == "0.1235"
    assert metric_text("best_eval_step", {}) == "—"
    assert [setting_text(v) for v in (None, True, "cosine", 3e-4, 4096, [1, 2])] == [
        "—",
        "True",
        "cosine",
        "0.0003",
        "4,096",
        "[1, 2]",
    ]

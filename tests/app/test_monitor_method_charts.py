"""The Monitor charts a training method's own numbers for runs of that method only: a DPO run's reward margin,
accuracy and log-probabilities, a GRPO run's reward with its spread, each named reward, completion length, KL and
clipped share, and the best and worst sampled answers of its latest steps; live and replayed from the run folder alike,
cleared between runs, and none of them for SFT."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from hone.core.events import RunFinished, RunStarted, StepMetrics, to_dict

STEPS = 12


def _started(run_dir, method: str, t0: float) -> RunStarted:
    return RunStarted(
        run_dir=str(run_dir),
        model="tiny",
        device="cuda",
        dtype="bfloat16",
        params_total=100,
        params_trainable=10,
        total_steps=STEPS,
        tokens_per_epoch=1000,
        config={"train": {"method": method}},
        time=t0,
    )


def _step(s: int, t0: float, **method) -> StepMetrics:
    return StepMetrics(
        step=s, total_steps=STEPS, epoch=s / STEPS, loss=1.0 / s, lr=1e-4, grad_norm=1.0, tokens=100,
        trained_tokens=50, tokens_per_s=1000.0, step_time=0.1, elapsed=0.1 * s, time=t0 + s, **method,
    )  # fmt: skip


def _dpo_steps(t0: float) -> list[StepMetrics]:
    rng = np.random.default_rng(3)
    return [
        _step(
            s,
            t0,
            reward_margin=float(rng.normal(0.1 * s, 0.05)),
            reward_accuracy=float(rng.uniform(0.4, 1.0)),
            chosen_logps=float(-50 - rng.uniform(0, 5)),
            rejected_logps=float(-60 - s - rng.uniform(0, 5)),
        )
        for s in range(1, STEPS + 1)
    ]


def _grpo_steps(t0: float) -> list[StepMetrics]:
    rng = np.random.default_rng(4)
    steps = []
    for s in range(1, STEPS + 1):
        rewards = {"format": float(rng.uniform(0, 1)), "answer": float(rng.uniform(0, 1))}
        if s > STEPS // 2:  # a reward that starts later (its line begins there)
            rewards["length"] = float(rng.uniform(-1, 0))
        steps.append(
            _step(
                s,
                t0,
                reward_mean=float(rng.uniform(0, 1)),
                reward_std=float(rng.uniform(0, 0.3)),
                rewards=rewards,
                completion_length=float(rng.integers(20, 200)),
                kl=float(rng.uniform(0, 0.05)),
                clip_fraction=float(rng.uniform(0, 0.2)),
                samples=[f"reward 0.9 · question {s} → best answer {s}", f"reward 0.1 · question {s} → worst {s}"],
            )
        )
    return steps


def _feed_live(monitor, run_dir, method: str, steps: list[StepMetrics], t0: float) -> None:
    monitor.handle(_started(run_dir, method, t0))
    for event in steps:
        monitor.handle(event)
    monitor.flush()


def _write_run(run_dir, method: str, steps: list[StepMetrics], t0: float) -> None:
    """A finished run's metrics.jsonl, its lines as RunWriter writes them (json.dumps of to_dict)."""
    run_dir.mkdir(parents=True)
    finished = RunFinished(step=STEPS, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=1.0)
    lines = [to_dict(_started(run_dir, method, t0)), *map(to_dict, steps), to_dict(finished)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _points(chart, key: str) -> tuple[list[float], list[float]]:
    x, y = chart.points(key)
    return x.tolist(), y.tolist()


def _assert_dpo(monitor, steps: list[StepMetrics]) -> None:
    charts = monitor.method_charts
    xs = [float(e.step) for e in steps]
    assert charts.method == "preference"
    assert all(chart.isVisible() for chart in charts.preference)
    assert not any(chart.isVisible() for chart in charts.grpo)
    assert _points(charts.margin_chart, "margin") == (xs, [e.reward_margin for e in steps])
    assert _points(charts.accuracy_chart, "accuracy") == (xs, [100 * e.reward_accuracy for e in steps])
    assert _points(charts.logps_chart, "chosen") == (xs, [e.chosen_logps for e in steps])
    assert _points(charts.logps_chart, "rejected") == (xs, [e.rejected_logps for e in steps])
    _, drawn_y = charts.margin_chart.series["margin"].curve.getData()
    assert list(drawn_y) == [e.reward_margin for e in steps], "the chart draws what it holds"


def _assert_grpo(monitor, steps: list[StepMetrics]) -> None:
    charts = monitor.method_charts
    xs = [float(e.step) for e in steps]
    assert charts.method == "grpo"
    assert all(chart.isVisible() for chart in charts.grpo)
    assert not any(chart.isVisible() for chart in charts.preference)
    assert _points(charts.reward_chart, "mean") == (xs, [e.reward_mean for e in steps])
    assert _points(charts.reward_chart, "high") == (xs, [e.reward_mean + e.reward_std for e in steps])
    assert _points(charts.reward_chart, "low") == (xs, [e.reward_mean - e.reward_std for e in steps])
    assert list(charts.rewards_chart.series) == ["format", "answer", "length"]
    for name in ("format", "answer"):
        assert _points(charts.rewards_chart, name) == (xs, [e.rewards[name] for e in steps])
    later = [e for e in steps if "length" in e.rewards]
    assert _points(charts.rewards_chart, "length") == (
        [float(e.step) for e in later],
        [e.rewards["length"] for e in later],
    )
    assert charts.rewards_chart.names["length"] == "length"
    assert _points(charts.length_chart, "length") == (xs, [e.completion_length for e in steps])
    assert _points(charts.kl_chart, "kl") == (xs, [e.kl for e in steps])
    assert _points(charts.clip_chart, "clip") == (xs, [100 * e.clip_fraction for e in steps])
    # the sampled answers, newest step first, with both of each step's answers
    assert charts.samples_panel.isVisible()
    text = charts.samples_text.toPlainText()
    assert text.startswith(f"step {steps[-1].step}\nreward 0.9 · question {steps[-1].step} → best answer")
    assert all(f"→ worst {e.step}" in text for e in steps)
    assert text.index(f"step {steps[-1].step}\n") < text.index(f"step {steps[0].step}\n")


@pytest.fixture
def monitor(make_window):
    window = make_window()
    window.show_page("monitor")
    return window.monitor


def test_a_dpo_run_charts_its_rewards_and_log_probabilities_live(monitor, tmp_path):
    steps = _dpo_steps(time.time())
    _feed_live(monitor, tmp_path / "dpo", "dpo", steps, steps[0].time - 1)
    _assert_dpo(monitor, steps)


def test_a_grpo_run_charts_its_reward_spread_rewards_length_and_kl_live(monitor, tmp_path):
    steps = _grpo_steps(time.time())
    _feed_live(monitor, tmp_path / "grpo", "grpo", steps, steps[0].time - 1)
    _assert_grpo(monitor, steps)


def test_a_sft_run_shows_no_method_charts(monitor, tmp_path):
    t0 = time.time()
    _feed_live(monitor, tmp_path / "sft", "sft", [_step(s, t0) for s in range(1, STEPS + 1)], t0)
    assert not monitor.method_charts.isVisible() and monitor.method_charts.method == ""
    assert all(chart.series[key].buffer.n == 0 for chart in monitor.method_charts.charts for key in chart.series)
    assert monitor.loss_chart.series["raw"].buffer.n == STEPS


def test_the_method_charts_show_from_the_start_of_a_run_of_that_method(monitor, tmp_path):
    monitor.handle(_started(tmp_path / "dpo", "kto", time.time()))
    assert monitor.method_charts.method == "preference" and monitor.method_charts.margin_chart.isVisible()


def test_a_run_whose_config_says_no_method_shows_the_charts_its_steps_call_for(monitor, tmp_path):
    steps = _dpo_steps(time.time())
    started = _started(tmp_path / "old", "dpo", steps[0].time - 1)
    monitor.handle(RunStarted(**{**started.__dict__, "config": {}}))
    assert monitor.method_charts.method == ""
    for event in steps:
        monitor.handle(event)
    monitor.flush()
    _assert_dpo(monitor, steps)


def test_the_method_charts_replay_from_the_run_folder_and_reset_between_runs(monitor, tmp_path):
    t0 = time.time() - 100
    dpo, grpo = _dpo_steps(t0), _grpo_steps(t0)
    _write_run(tmp_path / "runs" / "dpo", "dpo", dpo, t0)
    _write_run(tmp_path / "runs" / "grpo", "grpo", grpo, t0)
    _write_run(tmp_path / "runs" / "sft", "sft", [_step(s, t0) for s in range(1, STEPS + 1)], t0)
    monitor.show_run(tmp_path / "runs" / "dpo")
    _assert_dpo(monitor, dpo)
    monitor.show_run(tmp_path / "runs" / "grpo")
    _assert_grpo(monitor, grpo)
    assert all(chart.series[key].buffer.n == 0 for chart in monitor.method_charts.preference for key in chart.series)
    monitor.show_run(tmp_path / "runs" / "sft")
    assert not monitor.method_charts.isVisible() and monitor.method_charts.samples_text.toPlainText() == ""
    assert all(chart.series[key].buffer.n == 0 for chart in monitor.method_charts.charts for key in chart.series)
    assert list(monitor.method_charts.rewards_chart.series) == []

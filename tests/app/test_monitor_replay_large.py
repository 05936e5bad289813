"""A large run folder is read off the GUI thread, handed to the page a chunk at a time and drawn a chart per frame;
what the page then holds, draws and logs is what it holds, draws and logs when the same file is read at once."""

from __future__ import annotations

import json

import numpy as np

from hone.core.events import Notice, RunFinished, RunStarted, StepMetrics, to_dict

STEPS = 3000


def _write_run(run_dir) -> None:
    """A DPO run of STEPS steps (a notice and a damaged line among them), as RunWriter writes its lines."""
    rng = np.random.default_rng(7)
    t0 = 1.79e9
    run_dir.mkdir(parents=True)
    started = RunStarted(
        run_dir=str(run_dir), model="tiny", device="cuda", dtype="bfloat16", params_total=100, params_trainable=10,
        total_steps=STEPS, tokens_per_epoch=1000, config={"train": {"method": "dpo"}}, time=t0,
    )  # fmt: skip
    lines = [json.dumps(to_dict(started))]
    for s in range(1, STEPS + 1):
        step = StepMetrics(
            step=s, total_steps=STEPS, epoch=s / STEPS, loss=float(rng.uniform(0, 3)), lr=2e-4 * (1 - s / STEPS),
            grad_norm=1.0, tokens=100, trained_tokens=50, tokens_per_s=float(rng.normal(8000, 100)), step_time=0.5,
            elapsed=0.5 * s, mem_allocated=5 * 2**30 + s, mem_reserved=6 * 2**30, time=t0 + 0.5 * s,
            reward_margin=float(rng.normal()), reward_accuracy=float(rng.uniform()),
            chosen_logps=float(-rng.uniform(10, 90)), rejected_logps=float(-rng.uniform(10, 90)),
        )  # fmt: skip
        lines.append(json.dumps(to_dict(step)))
        if s == STEPS // 2:
            lines.append(json.dumps(to_dict(Notice(topic="memory", message="re-planned", step=s, time=t0 + 0.5 * s))))
            lines.append('{"event": "StepMetrics", "step": 1')  # damaged: skipped and counted
    finished = RunFinished(step=STEPS, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=0.5 * STEPS)
    lines.append(json.dumps(to_dict(finished)))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _snapshot(monitor) -> dict:
    charts = {
        "loss": monitor.loss_chart,
        "speed": monitor.speed_chart,
        "memory": monitor.memory_chart,
        "lr": monitor.lr_chart,
        **{f"method{i}": chart for i, chart in enumerate(monitor.method_charts.charts)},
    }
    held = {
        (name, key): tuple(a.tolist() for a in chart.points(key))
        for name, chart in charts.items()
        for key in chart.series
    }
    drawn = {  # what the chart gave pyqtgraph (getData would say what pyqtgraph thinned it to for the view)
        (name, key): tuple(
            np.asarray(a).tolist() for a in (chart.series[key].curve.xData, chart.series[key].curve.yData)
        )
        for name, chart in charts.items()
        for key in chart.series
    }
    log = [line.split("  ", 1)[-1] for line in monitor.log.toPlainText().splitlines()]  # without the clock times
    return {"held": held, "drawn": drawn, "log": log, "status": monitor.status, "last": monitor.last_step}


def test_a_large_run_read_in_the_background_ends_as_one_read_at_once(make_window, qtbot, tmp_path, monkeypatch):
    from hone.app.pages import monitor_replay
    from hone.core.train import metrics_series

    run_dir = tmp_path / "runs" / "dpo"
    _write_run(run_dir)
    monkeypatch.setattr(metrics_series, "CHUNK_BYTES", 64 << 10)  # some twenty chunks, lines cut across them
    window = make_window()
    window.show_page("monitor")
    monitor = window.monitor
    monitor.show_run(run_dir)  # small: read at once
    at_once = _snapshot(monitor)
    assert len(at_once["held"][("loss", "raw")][0]) == STEPS
    assert len(at_once["held"][("method0", "margin")][0]) == STEPS
    assert "1 line of metrics.jsonl could not be read" in "\n".join(at_once["log"])

    monkeypatch.setattr(monitor_replay, "READ_NOW_BYTES", 0)  # every file is large: read on a Task's thread
    with qtbot.waitSignal(monitor.run_shown, timeout=30_000):
        monitor.show_run(run_dir)
        assert monitor.replay.busy and monitor.replay.large
    assert not monitor.drawing_in_turn
    background = _snapshot(monitor)
    assert background == at_once

from __future__ import annotations

import json
import threading
import time

from hone.core import events
from hone.core.control import RunControl


def test_every_event_round_trips_through_json():
    samples = [
        events.RunStarted(
            run_dir="r",
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=2,
            total_steps=5,
            tokens_per_epoch=100,
            speed_paths={"a": "b"},
        ),
        events.StepMetrics(
            step=1,
            total_steps=5,
            epoch=0.2,
            loss=2.5,
            lr=1e-4,
            grad_norm=0.3,
            tokens=100,
            trained_tokens=40,
            tokens_per_s=50.0,
            step_time=2.0,
            elapsed=2.0,
            expert_load=[1, 2],
        ),
        events.EvalMetrics(step=1, loss=2.0, tokens=10),
        events.CheckpointSaved(step=1, path="p"),
        events.Notice(topic="offload", message="fell back"),
        events.RunFinished(step=5, run_dir="r", adapter_dir="a", final_loss=1.0, elapsed=3.0),
        events.RunFailed(reason="out of memory", advice="lower train.batch_tokens"),
        events.DatasetReport(split="train", files=["f"], rows_read=3, rows_kept=2, skipped={"no assistant": 1}),
    ]
    assert {type(e) for e in samples} >= set(events.EVENT_TYPES.values()) - {events.RunPaused, events.RunResumed}
    for event in samples:
        line = json.dumps(events.to_dict(event))
        assert events.from_dict(json.loads(line)) == event


def test_control_pauses_and_stop_wakes_a_paused_run():
    control = RunControl()
    control.pause()
    assert control.paused and not control.wait_while_paused(timeout=0.01)
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(control.wait_while_paused(timeout=5)))
    waiter.start()
    time.sleep(0.05)
    control.stop()
    waiter.join(timeout=5)
    assert woke == [True] and control.stop_requested and not control.paused


def test_a_supervised_step_line_leaves_out_the_other_methods_fields():
    import json

    from hone.core.events import StepMetrics, from_line, to_dict

    common = dict(step=1, total_steps=2, epoch=0.0, loss=1.0, lr=1e-3, grad_norm=1.0, tokens=1, trained_tokens=1)
    sft = StepMetrics(**common, tokens_per_s=1.0, step_time=1.0, elapsed=1.0)
    line = json.dumps(to_dict(sft))
    assert "reward" not in line and "kl" not in json.loads(line) and from_line(line) == sft
    grpo = StepMetrics(**common, tokens_per_s=1.0, step_time=1.0, elapsed=1.0, reward_mean=0.5, reward_std=0.0)
    data = to_dict(grpo)
    assert data["reward_mean"] == 0.5 and data["reward_std"] == 0.0 and "reward_margin" not in data
    assert from_line(json.dumps(data)) == grpo

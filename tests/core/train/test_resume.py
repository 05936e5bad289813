"""Exact resume: a run killed with SIGKILL after a checkpoint continues with `hone train --resume` and produces
the same losses, step for step, as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hone.core import events
from hone.core.train.checkpoints import complete_checkpoints, latest_checkpoint
from hone.core.train.run_dir import read_events


def _losses(evts, after_step: int = 0) -> dict[int, float]:
    return {e.step: e.loss for e in evts if isinstance(e, events.StepMetrics) and e.step > after_step}


def _hone(*args: str) -> list[str]:
    return [sys.executable, "-m", "hone.core.cli", *args]


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL is POSIX")
def test_resume_after_sigkill_matches_an_uninterrupted_run(tiny_model_dir, chat_files, tiny_config, tmp_path):
    model_dir = tiny_model_dir("tiny-dense")
    settings = [
        "train.max_steps=30",
        "output.checkpoint_every=4",
        "data.max_length=128",
        "train.batch_tokens=128",
        "lora.dropout=0.1",
    ]  # dropout: the RNG state must be restored too
    config = tiny_config(model_dir, chat_files, tmp_path / "runs", *settings, "output.name=killed")
    config_path = tmp_path / "killed.toml"
    config.save(config_path)
    run_dir = tmp_path / "runs" / "killed"

    proc = subprocess.Popen(_hone("train", str(config_path)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        saved = [e for e in read_events(run_dir) if isinstance(e, events.CheckpointSaved)]
        if saved:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_events(run_dir)
    assert not any(isinstance(e, events.RunFinished) for e in before)
    checkpoint = latest_checkpoint(run_dir)
    resumed_from = int(checkpoint.name.split("-")[1])
    assert resumed_from < 30

    done = subprocess.run(_hone("train", "--resume", str(run_dir)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = read_events(run_dir)
    after = logged[max(i for i, e in enumerate(logged) if isinstance(e, events.RunStarted)) :]
    # Steps the kill cut off after the checkpoint were trained again: metrics.jsonl holds each step once.
    assert [e.step for e in logged if isinstance(e, events.StepMetrics)] == list(range(1, 31))
    started = next(e for e in after if isinstance(e, events.RunStarted))
    assert started.resumed_from_step == resumed_from
    assert isinstance(after[-1], events.RunFinished) and after[-1].step == 30

    # The uninterrupted run trains in a process of its own too: CPU matmuls sum in an order that depends on the
    # number of threads, which the suite's own process may have changed (the Studio's in-window runs leave a core)
    straight = tiny_config(model_dir, chat_files, tmp_path / "runs", *settings, "output.name=straight")
    straight.save(tmp_path / "straight.toml")
    done = subprocess.run(_hone("train", str(tmp_path / "straight.toml")), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = _losses(read_events(tmp_path / "runs" / "straight"))
    resumed = _losses(after)
    assert sorted(resumed) == list(range(resumed_from + 1, 31))
    mismatched = {s: (resumed[s], reference[s]) for s in resumed if resumed[s] != reference[s]}
    assert not mismatched, f"losses differ after resume (step: resumed, uninterrupted): {mismatched}"
    # the part before the kill matched too
    early = _losses(before)
    assert all(early[s] == reference[s] for s in early)


def test_half_written_checkpoints_are_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-000004").mkdir(parents=True)
    (root / "step-000004" / "state.json").write_text(json.dumps({"step": 4}))  # no manifest, no weights
    (root / ".tmp-step-000008").mkdir()  # killed while writing
    (root / "step-000012").mkdir()
    assert complete_checkpoints(tmp_path) == []  # complete means: its manifest verifies (test_checkpoints.py)

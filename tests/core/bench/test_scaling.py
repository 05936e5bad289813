"""`hone bench SCENARIO --gpus N`: Hone's `all` run on one and on N processes (gloo processes on the CPU here),
each process on its own batch, with the scaling efficiency computed from what both launches measured."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hone.core.bench.scaling import ScalingRun, efficiency
from hone.core.cli import main

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or os.name != "posix", reason="torch.distributed with gloo"
)


def test_two_processes_against_one(tmp_path, capsys, monkeypatch):
    """With --parallel fsdp (the data-parallel step is the same code without the split)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "scaling.json"
    assert (
        main(
            [
                "bench",
                "tiny-dense",
                "--gpus",
                "2",
                "--parallel",
                "fsdp",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    one, two = (ScalingRun(**run) for run in data["runs"])
    assert (one.processes, two.processes) == (1, 2)
    assert two.tokens_per_step > one.tokens_per_step  # each process trains a batch of its own
    assert len(one.step_times_s) == len(two.step_times_s) == 2
    assert one.tokens_per_s > 0 and two.tokens_per_s > 0
    assert data["efficiency"] == pytest.approx(efficiency(one, two))
    assert one.first_loss == one.first_loss and two.first_loss == two.first_loss  # finite
    assert "lora" in two.speed_paths
    assert two.speed_paths["parallel"].startswith("FSDP2 over 2 processes"), two.speed_paths
    assert data["options"]["parallel"] == "fsdp"
    printed = capsys.readouterr().out
    assert "efficiency" in printed and "processes" in printed


def test_efficiency_is_tokens_per_second_per_process_against_one():
    one = ScalingRun(1, 100, [1.0], 100.0, [], 1.0, {})
    two = ScalingRun(2, 200, [1.1], 181.8, [], 1.0, {})
    assert efficiency(one, two) == pytest.approx(0.909)


def test_what_scaling_does_not_measure_is_refused(capsys):
    for argv, said in (
        (["--gpus", "1"], "scaling is measured from 2 processes on"),
        (["--gpus", "2", "--peer", "unsloth"], "it does not take --peer"),
        (["--gpus", "2", "--qlora"], "it does not take --qlora"),
        (["--gpus", "2", "--no-sync-count"], "it does not take --no-sync-count"),
    ):
        assert main(["bench", "tiny-dense", *argv]) == 2
        assert said in capsys.readouterr().err
    assert main(["bench", "vision-smolvlm", "--gpus", "2"]) == 2
    assert "vision scenario" in capsys.readouterr().err
    assert main(["bench", "tiny-dense", "--parallel", "fsdp"]) == 2
    assert "--parallel is for the scaling measurement" in capsys.readouterr().err


def test_a_failed_launch_names_what_the_processes_said_before_torchruns_summary():
    """torchrun ends a failed launch with a long summary of its own (its traceback, each rank's signal); what the
    process that failed printed comes before it, and the message keeps both."""
    from hone.core.bench.scaling import failure_text

    child = (
        "[rank1]: terminate called after throwing an instance of 'gloo::IoException'\n"
        "[rank1]:   what():  Connection reset by peer\n"
    )
    summary = (
        'Traceback (most recent call last):\n  File "torch/distributed/run.py", line 1, in main\n'
        + "    frame\n" * 200
        + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n  rank      : 1 (local_rank: 1)\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 8836\n"
    )
    text = failure_text("W1202 setup noise\n" * 500 + child + summary)
    assert "Connection reset by peer" in text and "gloo::IoException" in text
    assert "Signal 6 (SIGABRT)" in text and "rank      : 1" in text
    assert len(text) < 3000
    assert failure_text("plain error\n") == "plain error"

"""GPU tests for several processes training one run over NCCL (run with `pytest -m gpu
tests/core/train/test_distributed_gpu.py`).

- one process under torchrun (NCCL, every exchange made) trains what the plain process trains;
- with two GPUs or more: `hone train --gpus 2` trains what one process trains with the same packs per step.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hone.core import events
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SETTINGS = [
    "train.max_steps=4",
    "data.max_length=128",
    "train.batch_tokens=256",
    "lora.dropout=0",
    "model.dtype=float32",
    "speed.checkpoint=off",
    "train.fit_memory=false",
]


def losses(evts) -> dict[int, float]:
    return {e.step: e.loss for e in evts if isinstance(e, events.StepMetrics)}


def test_one_process_under_torchrun_trains_like_the_plain_process(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", *SETTINGS, "output.name=nccl")
    config.save(tmp_path / "run.toml")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "1",
            "-m",
            "hone.core.cli",
            "train",
            str(tmp_path / "run.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logged = read_events(tmp_path / "runs" / "nccl")
    started = next(e for e in logged if isinstance(e, events.RunStarted))
    assert started.device == "cuda:0" and started.processes == 1
    assert all(len(e.mem_by_gpu) == 1 and e.mem_by_gpu[0] > 0 for e in logged if isinstance(e, events.StepMetrics))
    plain = list(Trainer(config.with_overrides(["output.name=plain"]), device="cuda").run())
    assert isinstance(plain[-1], events.RunFinished), plain[-1]
    assert losses(logged) == pytest.approx(losses(plain), rel=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_train_what_one_gpu_trains(tiny_model_dir, chat_files, tiny_config, tmp_path):
    two = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", *SETTINGS, "output.name=two")
    two.save(tmp_path / "two.toml")
    done = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "train", str(tmp_path / "two.toml"), "--gpus", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    one = two.with_overrides(["output.name=one", "train.batch_tokens=128", "train.grad_accum=2"])
    single = list(Trainer(one, device="cuda").run())
    assert isinstance(single[-1], events.RunFinished), single[-1]
    logged = read_events(tmp_path / "runs" / "two")
    assert next(e for e in logged if isinstance(e, events.RunStarted)).processes == 2
    assert losses(logged) == pytest.approx(losses(single), rel=1e-4)


@pytest.mark.parametrize("processes", [1, 2])
def test_fsdp_trains_what_one_plain_process_trains(processes, tiny_model_dir, chat_files, tiny_config, tmp_path):
    """train.parallel = fsdp with every speed path on (bf16, kernels, offloaded checkpoints, vocabulary tables in
    host memory): the decoder layers' frozen weights split over `processes` GPUs, gathered per layer."""
    if torch.cuda.device_count() < processes:
        pytest.skip(f"needs {processes} GPUs")
    common = [
        "train.max_steps=4",
        "data.max_length=128",
        "lora.dropout=0",
        "train.fit_memory=false",
        "speed.checkpoint=offload-double",
    ]
    sharded = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        *common,
        "train.batch_tokens=256",
        "train.parallel=fsdp",
        "output.name=fsdp",
    )
    sharded.save(tmp_path / "fsdp.toml")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(processes),
            "-m",
            "hone.core.cli",
            "train",
            str(tmp_path / "fsdp.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    logged = read_events(tmp_path / "runs" / "fsdp")
    started = next(e for e in logged if isinstance(e, events.RunStarted))
    assert started.speed_paths["parallel"].startswith(f"FSDP2 over {processes} process"), started.speed_paths
    plain = sharded.with_overrides(
        [
            "output.name=plain",
            "train.parallel=auto",
            f"train.batch_tokens={256 // processes}",
            f"train.grad_accum={processes}",
        ]
    )
    single = list(Trainer(plain, device="cuda").run())
    assert isinstance(single[-1], events.RunFinished), single[-1]
    assert losses(logged) == pytest.approx(losses(single), rel=1e-3)

"""`train.parallel = fsdp` (torchrun, gloo on the CPU): the decoder layers' frozen weights are split across the
processes; two such processes train what one process trains with the same packs per step, and a resume on two
processes goes on exactly. `auto` takes FSDP only when the step does not fit with the whole model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch
from test_distributed import SETTINGS, adapter_weights, assert_same_weights, env, step_losses, torchrun

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import ConfigError
from hone.core.train import sharding
from hone.core.train.checkpoints import complete_checkpoints
from hone.core.train.distributed import World
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or os.name != "posix", reason="torch.distributed with gloo, POSIX signals"
)

TWO = World(rank=0, size=2, launched=True, local_size=2)
# recompute checkpointing on, so the layers' weights are gathered again for the recompute in backward
FSDP = [*SETTINGS, "train.parallel=fsdp", "speed.checkpoint=gpu", "lora.dropout=0"]
# answers at each evaluation: every process generates (each forward gathers the split weights), process 0 writes
SAMPLES = ['train.sample_prompts=["Name a color."]', "train.sample_max_new_tokens=5"]


@pytest.fixture(scope="module")
def fsdp_run(tiny_model_dir, chat_files, tmp_path_factory):
    from tests.core.conftest import make_tiny_config

    root = tmp_path_factory.mktemp("fsdp")
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        root / "runs",
        *FSDP,
        *SAMPLES,
        "output.name=split",
        "train.batch_tokens=256",
        "train.grad_accum=1",
    )
    config.save(root / "run.toml")
    done = subprocess.run(torchrun(str(root / "run.toml")), capture_output=True, text=True, timeout=600, env=env())
    assert done.returncode == 0, done.stderr[-4000:]
    return root, root / "runs" / "split"


def test_two_sharded_processes_train_what_one_process_trains(
    fsdp_run, tiny_config, tiny_model_dir, chat_files, tmp_path
):
    _, run_dir = fsdp_run
    logged = read_events(run_dir)
    started = next(e for e in logged if isinstance(e, events.RunStarted))
    assert started.processes == 2
    assert started.speed_paths["parallel"].startswith("FSDP2 over 2 processes"), started.speed_paths
    assert "train.parallel = fsdp" in started.speed_paths["parallel"]

    one = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        *FSDP,
        *SAMPLES,
        "output.name=one",
        "train.batch_tokens=128",
        "train.grad_accum=2",
    )
    single = list(Trainer(one, device="cpu").run())
    assert isinstance(single[-1], events.RunFinished), single[-1]
    assert "parallel" not in next(e for e in single if isinstance(e, events.RunStarted)).speed_paths
    said = [e.message for e in single if isinstance(e, events.Notice) and e.topic == "parallel"]
    assert len(said) == 1 and "this run has one" in said[0]  # fsdp asked for, one plain process
    one_losses = {e.step: e.loss for e in single if isinstance(e, events.StepMetrics)}
    assert step_losses(run_dir) == pytest.approx(one_losses, rel=1e-5)
    evals = [[e.loss for e in evts if isinstance(e, events.EvalMetrics)] for evts in (single, logged)]
    assert evals[1] == pytest.approx(evals[0], rel=1e-5) and len(evals[0]) == 2
    assert_same_weights(adapter_weights(run_dir), adapter_weights(tmp_path / "runs" / "one"))
    from hone.core.train.samples_file import read_samples

    split, alone = read_samples(run_dir), read_samples(tmp_path / "runs" / "one")
    assert [s.step for s in split] == [3, 6] and [s.samples for s in split] == [s.samples for s in alone]


def test_a_sharded_run_resumes_exactly_on_two_processes(fsdp_run, tmp_path):
    _, full_dir = fsdp_run
    run_dir = tmp_path / "again"
    shutil.copytree(full_dir, run_dir, ignore=shutil.ignore_patterns("run.lock", "adapter"))
    for later in complete_checkpoints(run_dir)[1:]:  # back to the checkpoint of step 2
        shutil.rmtree(later)
    recorded = RunConfig.load(run_dir / "config.toml")
    assert recorded.train.parallel == "fsdp"
    done = subprocess.run(torchrun("--resume", str(run_dir)), capture_output=True, text=True, timeout=600, env=env())
    assert done.returncode == 0, done.stderr[-4000:]
    assert step_losses(run_dir, after=2) == step_losses(full_dir, after=2)
    assert_same_weights(adapter_weights(run_dir), adapter_weights(full_dir), atol=0)


def _config(*overrides: str) -> RunConfig:
    return RunConfig().with_overrides([f"model.name_or_path={json.dumps('x')}", *overrides])


def test_auto_shards_only_when_the_whole_model_does_not_fit():
    auto = _config()
    assert sharding.choose(auto, TWO, is_vision=False, fits_whole=True)[0] == "ddp"
    assert sharding.choose(auto, TWO, is_vision=False, fits_whole=None)[0] == "ddp"
    mode, why = sharding.choose(auto, TWO, is_vision=False, fits_whole=False)
    assert mode == "fsdp" and "does not fit" in why
    assert sharding.choose(auto, World(), is_vision=False, fits_whole=False)[0] == "ddp"  # one process
    assert sharding.choose(_config("lora.qlora=true"), TWO, is_vision=False, fits_whole=False)[0] == "ddp"
    assert sharding.choose(_config("train.parallel=ddp"), TWO, is_vision=False, fits_whole=False)[0] == "ddp"


def test_fsdp_asked_for_what_it_cannot_split_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"lora\.qlora"):
        sharding.choose(_config("train.parallel=fsdp", "lora.qlora=true"), TWO, is_vision=False, fits_whole=True)
    with pytest.raises(ConfigError, match="vision"):
        sharding.choose(_config("train.parallel=fsdp"), TWO, is_vision=True, fits_whole=True)
    with pytest.raises(ConfigError, match="not one of auto, ddp, fsdp"):
        _config("train.parallel=zero3")

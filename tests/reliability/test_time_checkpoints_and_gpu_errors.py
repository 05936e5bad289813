"""What a kill -9, a power cut or a lost GPU costs a run: checkpoints by time (output.checkpoint_minutes, on by
default and said in the run's first lines; a LoRA run's hold only the adapter's weights), and a GPU error in a step
(put in by the test: the model's decoder layer raises CUDA's error) ends the run "interrupted", with the step it
goes on from, which a resume then does. Tiny random-init model on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

from hone.core import events
from hone.core.cli import main as hone_main
from hone.core.cli.stop_signals import EXIT_STOPPED_BY_SYSTEM
from hone.core.config import RunConfig
from hone.core.train.checkpoints import WEIGHTS_FILE, complete_checkpoints
from hone.core.train.interruptions import CheckpointClock, is_gpu_failure
from hone.core.train.run_dir import live_summary, read_events
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config, write_rows

SETTINGS = ["data.max_length=128", "train.batch_tokens=128", "data.eval=[]", "output.keep_checkpoints=10"]
MINUTES_PER_STEP = 4.0  # the clock the tests give the trainer: each step takes four minutes


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    from hone.core.demo.text_data import make_dataset

    rows, _ = make_dataset(n_train=24, n_eval=4, seed=3)
    return write_rows(tmp_path_factory.mktemp("data") / "train.jsonl", rows)


@pytest.fixture
def config(tiny_model_dir, train_file, tmp_path):
    def make(*settings: str) -> RunConfig:
        model = tiny_model_dir("tiny-dense")
        return make_tiny_config(model, (train_file, train_file), tmp_path / "runs", *SETTINGS, *settings)

    return make


def _run_with_clock(config: RunConfig) -> list[events.Event]:
    trainer = Trainer(config, device="cpu")
    trainer.clock = lambda: trainer.step * MINUTES_PER_STEP * 60.0
    return list(trainer.run())


def test_checkpoints_every_ten_minutes_of_training_by_default_said_first_lora_weights_only(config, tmp_path):
    assert RunConfig().output.checkpoint_minutes == 10.0
    got = _run_with_clock(config("train.max_steps=7", "output.name=timed"))
    assert isinstance(got[-1], events.RunFinished), got[-1]
    # 4 minutes a step: 12 minutes at step 3 (the first boundary past 10), 12 more at step 6, then the end.
    assert [e.step for e in got if isinstance(e, events.CheckpointSaved)] == [3, 6, 7]
    said = next(e for e in got if isinstance(e, events.Notice) and e.topic == "checkpoints")
    assert "every 10 minutes of training" in said.message and "a kill costs at most 10 minutes" in said.message
    assert got.index(said) < next(i for i, e in enumerate(got) if isinstance(e, events.StepMetrics))
    run_dir = tmp_path / "runs" / "timed"
    assert "every 10 minutes of training" in (run_dir / "train.log").read_text()

    # A LoRA run's checkpoint: the adapter's weights only, not the base model's.
    with safe_open(str(run_dir / "checkpoints" / "step-000003" / WEIGHTS_FILE), "pt") as f:
        names = list(f.keys())
        saved = sum(f.get_tensor(n).numel() for n in names)
    assert names and all("lora_" in n for n in names), names[:5]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    started = next(e for e in got if isinstance(e, events.RunStarted))
    assert saved == started.params_trainable < started.params_total / 50


def test_checkpoints_by_time_off_saves_at_the_end_only_and_warns(config):
    got = _run_with_clock(config("train.max_steps=7", "output.checkpoint_minutes=0", "output.name=untimed"))
    assert [e.step for e in got if isinstance(e, events.CheckpointSaved)] == [7]
    said = next(e for e in got if isinstance(e, events.Notice) and e.topic == "checkpoints")
    assert said.level == "warning" and "loses the whole run" in said.message


def test_time_paused_is_not_training_time():
    now = [0.0]
    clock = CheckpointClock(1.0, lambda: now[0])
    now[0] = 59.0
    assert not clock.due()
    clock.paused_for(30.0)  # half a minute paused
    now[0] = 80.0
    assert not clock.due()
    now[0] = 89.0
    assert not clock.due()
    now[0] = 90.0  # a minute of training
    assert clock.due()
    clock.saved()
    now[0] = 149.0
    assert not clock.due()
    assert not CheckpointClock(0.0, lambda: now[0] * 1000).due()  # 0 = off


@pytest.mark.parametrize(
    ("error", "gpu"),
    [
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), True),
        (RuntimeError("CUDA error: device-side assert triggered"), True),
        (RuntimeError("CUDA error: unspecified launch failure"), True),
        (RuntimeError("CUDA error: no CUDA-capable device is detected"), True),
        (RuntimeError("CUDA-capable device(s) is/are busy or unavailable"), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (RuntimeError("CUDA error: out of memory"), False),  # out of memory: the trainer's own recovery
        (RuntimeError("expected scalar type Float but found Half"), False),
        (ValueError("CUDA error"), False),
    ],
)
def test_which_errors_are_the_gpu_failing(error, gpu):
    assert is_gpu_failure(error) is gpu


def test_a_gpu_error_in_a_step_ends_the_run_interrupted_and_it_goes_on_from_its_checkpoint(
    config, tmp_path, monkeypatch, capsys
):
    settings = ("train.max_steps=6", "output.checkpoint_every=2", "output.name=lost")
    config(*settings).save(tmp_path / "run.toml")
    run_dir = tmp_path / "runs" / "lost"
    layer_forward, calls = Qwen3DecoderLayer.forward, []

    def lost_in_step_5(self, *args, **kwargs):
        if len([e for e in read_events(run_dir) if isinstance(e, events.StepMetrics)]) == 4:
            calls.append(1)
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        return layer_forward(self, *args, **kwargs)

    monkeypatch.setattr(Qwen3DecoderLayer, "forward", lost_in_step_5)
    code = hone_main(["train", str(tmp_path / "run.toml")])
    assert code == EXIT_STOPPED_BY_SYSTEM and calls, capsys.readouterr().out[-2000:]
    failed = read_events(run_dir)[-1]
    assert isinstance(failed, events.RunFailed) and failed.interrupted, failed
    assert failed.reason == "the GPU stopped working at step 5 (CUDA error: an illegal memory access was encountered)"
    assert f"go on from step 4, its last complete checkpoint: `hone train --resume {run_dir}`" in failed.advice
    assert "restart" in failed.advice
    summary = json.loads((run_dir / "run.json").read_text())
    assert summary["status"] == "interrupted" and summary["reason"] == failed.reason
    assert live_summary(run_dir).status == "interrupted"
    assert [p.name for p in complete_checkpoints(run_dir)] == ["step-000002", "step-000004"]

    monkeypatch.setattr(Qwen3DecoderLayer, "forward", layer_forward)  # the GPU is back
    resumed = list(Trainer(RunConfig.load(run_dir / "config.toml"), device="cpu", resume_dir=run_dir).run())
    assert isinstance(resumed[-1], events.RunFinished), resumed[-1]
    assert next(e for e in resumed if isinstance(e, events.RunStarted)).resumed_from_step == 4
    assert [e.step for e in read_events(run_dir) if isinstance(e, events.StepMetrics)] == [1, 2, 3, 4, 5, 6]

"""Exact resume on a real GPU (`pytest -m gpu`): a run stopped after a checkpoint and resumed gives the losses of a
run that never stopped. It goes through the GPU's defaults (bf16 autocast, the fused AdamW kernel's flat state,
CUDA random state for dropout), which the CPU resume tests cannot reach, and loads them with weights_only."""

from __future__ import annotations

import pytest
import torch

from hone.core import events
from hone.core.control import RunControl
from hone.core.train.checkpoints import latest_checkpoint
from hone.core.train.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def losses(got) -> dict[int, float]:
    return {e.step: e.loss for e in got if isinstance(e, events.StepMetrics)}


def test_a_stopped_run_resumes_with_the_losses_of_one_that_never_stopped(
    tiny_model_dir, chat_files, tiny_config, tmp_path
):
    model_dir = tiny_model_dir("tiny-dense")
    settings = ["train.max_steps=8", "output.checkpoint_every=3", "lora.dropout=0.1"]
    straight = losses(
        Trainer(tiny_config(model_dir, chat_files, tmp_path, *settings, "output.name=straight"), device="cuda").run()
    )

    config = tiny_config(model_dir, chat_files, tmp_path, *settings, "output.name=stopped")
    control = RunControl()
    first = []
    for event in Trainer(config, control, device="cuda").run():
        first.append(event)
        if isinstance(event, events.CheckpointSaved):
            control.stop()
    assert first[-1].stopped and first[-1].step < 8, first[-1]
    run_dir = tmp_path / "stopped"
    resumed_from = int(latest_checkpoint(run_dir).name.split("-")[1])
    assert 3 <= resumed_from < 8

    after = list(Trainer(config, resume_dir=run_dir, device="cuda").run())
    assert isinstance(after[-1], events.RunFinished), after[-1]
    resumed = losses(after)
    assert sorted(resumed) == list(range(resumed_from + 1, 9))
    assert resumed == pytest.approx({s: straight[s] for s in resumed}, rel=1e-5)

"""Training in float16, as on GPUs without bf16 (Turing laptops), on a CUDA GPU (`pytest -m gpu`): the default speed
paths (packed varlen attention, fused kernels, chunked loss, offloaded checkpoints, the MoE backends) give the plain
path's losses in float16, the loss is scaled (the scaler's state is in the checkpoint), and the run learns."""

from __future__ import annotations

import pytest
import torch

from hone.core import events
from hone.core.train.trainer import Trainer
from tests.helpers.speed_paths import FAST, PLAIN

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(tiny_config, model_dir, chat_files, runs, *overrides):
    config = tiny_config(
        model_dir, chat_files, runs, "model.dtype=float16", "train.batch_tokens=1024", "data.max_length=512",
        "train.lr=2e-3", "train.warmup_steps=0", *overrides,
    )  # fmt: skip
    got = list(Trainer(config, device="cuda").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    started = next(e for e in got if isinstance(e, events.RunStarted))
    return started, [e for e in got if isinstance(e, events.StepMetrics)], next(runs.iterdir())


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama", "tiny-moe-qwen3", "tiny-moe-gptoss"])
def test_float16_speed_paths_match_the_plain_path_with_the_loss_scaled(tiny_config, tiny_model_dir, chat_files,
                                                                       tmp_path, shape):  # fmt: skip
    model_dir = tiny_model_dir(shape)
    _, plain, _ = _run(tiny_config, model_dir, chat_files, tmp_path / "plain", *PLAIN)
    started, fast, run_dir = _run(tiny_config, model_dir, chat_files, tmp_path / "fast", *FAST)
    assert not started.speed_paths["kernels"].startswith("off"), started.speed_paths
    assert len(plain) == len(fast) == 3
    # the first step runs the same weights on the same rows: float16 rounding apart, the same loss
    assert fast[0].loss == pytest.approx(plain[0].loss, rel=2e-3), shape
    for want, got in zip(plain[1:], fast[1:]):
        assert got.loss == pytest.approx(want.loss, rel=2e-2), (shape, want.step)
    state = torch.load(sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "training_state.pt", weights_only=True)
    scaler = state["scaler"]
    assert scaler is not None and scaler["scale"] > 1.0, scaler  # the loss was scaled: float16 gradients


def test_float16_learns_on_the_default_paths(tiny_config, tiny_model_dir, chat_files, tmp_path):
    _, steps, _ = _run(tiny_config, tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=10")
    losses = [s.loss for s in steps]
    # the tiny random-init model drops by about 0.4 over these 10 steps at this rate
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.2, losses

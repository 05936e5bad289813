"""Steps recorded as CUDA graphs on a CUDA GPU (`pytest -m gpu`): the same losses and gradient norms as the same
steps run eagerly, with the shapes recorded once and replayed after, padded batches included."""

from __future__ import annotations

import pytest
import torch

from hone.core.bench.batch import make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.variants import ALL_ON, Variant

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _steps(shape: str, tokens: int, graphs: str, steps: int = 5):
    variant = Variant("all", {**ALL_ON, "cuda_graphs": graphs}, "test")
    batch = make_batch(tokens, 100, seed=3, min_len=16, max_len=400)
    runner = HoneRunner(
        variant, get_scenario(shape), None, batch, lora_r=8, seed=0, dtype=torch.bfloat16, device="cuda"
    )
    runner.setup()
    try:
        outcomes = [runner.step() for _ in range(steps)]
        return outcomes, runner.describe()["speed_paths"]["cuda_graphs"], runner.runner.graphs
    finally:
        runner.teardown()


@pytest.mark.parametrize("tokens", [4096, 3000])  # on a token bucket; padded with filler sequences
@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_recorded_steps_train_as_the_eager_ones(shape, tokens):
    eager, eager_choice, none = _steps(shape, tokens, "off")
    recorded, choice, graphs = _steps(shape, tokens, "on")
    assert none is None and eager_choice.startswith("off"), eager_choice
    assert graphs is not None and graphs.failed is None, choice
    # first of the shape eager, then recorded and replayed, then replayed
    assert (graphs.stats.eager, graphs.stats.recorded, graphs.stats.replays) == (1, 1, 4), choice
    for want, got in zip(eager, recorded, strict=True):
        # a replay's reported peak is its eager pass's: never below what the same step holds eagerly by much
        assert got.peak_bytes > 0.5 * want.peak_bytes, (shape, tokens, got.peak_bytes, want.peak_bytes)
        assert got.loss == pytest.approx(want.loss, rel=1e-2), (shape, tokens)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=5e-2), (shape, tokens)
    assert recorded[-1].loss < recorded[0].loss  # the replays train: the same rows, five steps


def test_a_replaced_gradient_is_recorded_again_not_replayed_blind():
    variant = Variant("all", {**ALL_ON, "cuda_graphs": "on"}, "test")
    runner = HoneRunner(
        variant, get_scenario("tiny-dense"), None, make_batch(2048, 100, seed=1, min_len=16, max_len=300),
        lora_r=8, seed=0, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    runner.setup()
    try:
        losses = [runner.step().loss for _ in range(3)]
        runner.runner.optimizer.zero_grad(set_to_none=True)  # what a caller outside the trainer might do
        losses += [runner.step().loss for _ in range(2)]
        stats = runner.runner.graphs.stats
        assert stats.dropped == 1 and stats.recorded == 2, stats
        assert losses[-1] < losses[0] and all(torch.isfinite(torch.tensor(losses))), losses
    finally:
        runner.teardown()


def test_a_training_run_with_changing_packs_learns_as_the_eager_one(tiny_config, tiny_model_dir, chat_files, tmp_path):
    """The trainer's own run: packs of varying tokens and sequences (fillers, several shapes), the next step's
    batches collated on the background thread while a shape is recorded, an evaluation between steps."""
    from hone.core import events
    from hone.core.train.trainer import Trainer

    def run(runs, *overrides):
        config = tiny_config(
            tiny_model_dir("tiny-dense"), chat_files, runs, "train.batch_tokens=384", "data.max_length=256",
            "train.lr=2e-3", "train.warmup_steps=0", "train.max_steps=12", *overrides,
        )  # fmt: skip
        got = list(Trainer(config, device="cuda").run())
        assert isinstance(got[-1], events.RunFinished), got[-1]
        started = next(e for e in got if isinstance(e, events.RunStarted))
        warned = [e.message for e in got if isinstance(e, events.Notice) and e.topic == "cuda_graphs"]
        return started.speed_paths["cuda_graphs"], [e.loss for e in got if isinstance(e, events.StepMetrics)], warned

    eager_choice, eager, _ = run(tmp_path / "eager", 'speed.cuda_graphs="off"')
    choice, recorded, warned = run(tmp_path / "recorded")
    assert eager_choice.startswith("off") and not choice.startswith("off") and not warned, (choice, warned)
    assert len(recorded) == len(eager) == 12
    for step, (want, got) in enumerate(zip(eager, recorded, strict=True)):
        assert got == pytest.approx(want, rel=2e-2), (step, want, got)
    assert recorded[-1] < recorded[0]

"""CUDA-graph steps on the CPU: the shapes batches are padded to, padding that changes neither loss nor gradients,
when a run may record, and the trainer's step driving `StepGraphs` through a stand-in for the CUDA calls that
records nothing and replays by running the recorded pass again (the real recording: test_step_graphs_gpu.py)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from hone.core.bench.batch import make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.variants import ALL_ON, Variant
from hone.core.config import SpeedConfig
from hone.core.speed import graph_choice, paths
from hone.core.speed.graph_choice import model_choice, run_choice
from hone.core.speed.step_graphs import GraphShape, graph_shape, pad_packed, shape_of
from hone.kernels.weight_casts import cast_weight, own_weight_casts, reuse_weight_casts
from tests.helpers.offload import lora_model, loss_and_grads, packed_batch

# ---- shapes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [40, 100, 1000, 3000, 4095, 4097, 16000, 16383, 16384, 70000])
def test_every_batch_fits_its_shape_with_little_padding(tokens):
    for rows in [r for r in (1, 2, 3, 29, 64, 300) if r <= tokens // 2]:  # rows of at least two tokens
        longest, trained = max(2, tokens // rows), tokens - rows
        shape = graph_shape(tokens, rows, longest, trained)
        padding, fillers = shape.tokens - tokens, shape.rows - rows
        assert shape.tokens >= tokens and shape.rows >= rows and trained <= shape.trained <= shape.tokens
        assert (padding > 0) == (fillers > 0) and padding >= fillers  # every filler holds a token
        assert shape.max_length >= longest and (fillers == 0 or shape.max_length * fillers >= padding)
        if tokens >= 4096 and rows <= 64:
            assert padding <= tokens / 16, shape  # a token bucket is 1/16 of the power of two below


def test_shapes_repeat_for_batches_of_about_one_size():
    sizes = [(t, r, m) for t in range(15_400, 16_384, 37) for r in (20, 25, 29) for m in (1500, 2000)]
    shapes = {graph_shape(t, r, m, t - r) for t, r, m in sizes}
    assert len(shapes) <= 4, shapes  # a handful of graphs covers a run whose packs fill a 16K budget
    assert graph_shape(16_384, 29, 2025, 16_355) == GraphShape(16_384, 29, 2048, 16_384)  # on a bucket: no fillers


def test_a_padded_batch_gives_the_same_loss_and_gradients():
    from hone.core.models.shapes import build_model
    from hone.core.speed import attention

    model = lora_model(build_model("tiny-dense", seed=0))
    attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    batch = packed_batch([37, 90, 5, 61], vocab=100)
    shape = shape_of(batch)
    padded = pad_packed(batch, shape)
    assert padded.input_ids.shape[1] == shape.tokens and len(padded.seq_lens) == shape.rows > 4
    assert padded.trained_positions.numel() == shape.trained and padded.num_trained == batch.num_trained
    assert int(padded.cu_seqlens[-1]) == shape.tokens and padded.max_seqlen == shape.max_length
    want_loss, want = loss_and_grads(model, batch)
    got_loss, got = loss_and_grads(model, padded)
    assert got_loss == pytest.approx(want_loss.item(), rel=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_shape_too_small_for_the_batch_is_refused():
    batch = packed_batch([30, 30], vocab=100)
    with pytest.raises(ValueError, match="does not fit"):
        pad_packed(batch, GraphShape(64, 2, 64, 64))  # padding and no filler sequence to hold it
    with pytest.raises(ValueError, match="longer than"):
        pad_packed(batch, GraphShape(128, 3, 32, 64))


# ---- who may record ----------------------------------------------------------------------------------------------


def _model(**changes):
    facts = dict(params=600_000_000, is_moe=False, is_vision=False, cfg=SpeedConfig(checkpoint="gpu"))
    return model_choice(changes.pop("mode", "auto"), changes.pop("device", "cuda"), **{**facts, **changes})


def test_auto_records_small_dense_text_models_on_a_gpu_only():
    assert _model()[0] is True
    for changes, why in [
        (dict(device="cpu"), "NVIDIA GPU"),
        (dict(mode="off"), "speed.cuda_graphs = off"),
        (dict(params=8_000_000_000), "3B parameters"),
        (dict(is_moe=True), "MoE"),
        (dict(is_vision=True), "images"),
        (dict(cfg=SpeedConfig(checkpoint="offload")), "host memory"),
        (dict(cfg=SpeedConfig(checkpoint="gpu", packing=False)), "packing"),
        (dict(cfg=SpeedConfig(checkpoint="gpu", layer_group_tokens=4096)), "layer_group_tokens"),
    ]:
        on, reason = _model(**changes)
        assert not on and reason.startswith("off") and why in reason, (changes, reason)
    assert _model(mode="on", params=8_000_000_000, is_moe=True)[0] is True  # `on` tries what auto leaves


def test_runs_that_cannot_replay_say_why():
    sft = dict(method="sft", processes=1, dropout=0.0, optimizer="adamw", takes_gradients=False)
    assert run_choice(**sft) is None
    for changes, why in [
        (dict(method="dpo"), "train.method = dpo"),
        (dict(processes=2), "processes"),
        (dict(dropout=0.1), "dropout"),
        (dict(optimizer="adamw-bf16", takes_gradients=True), "adamw-bf16"),
    ]:
        assert why in run_choice(**{**sft, **changes}), changes


def test_attention_that_splits_batches_on_the_host_is_not_replayed():
    def blocker(name, grouped=False):
        varlen = SimpleNamespace(grouped_backward=grouped) if name == "varlen" else None
        return paths._attention_blocker(torch.nn.Linear(2, 2), SimpleNamespace(attention=SimpleNamespace(
            name=name, varlen=varlen)))  # fmt: skip

    assert blocker("varlen") is None and blocker("flash") is None
    assert "sdpa attention reads each batch's row lengths" in blocker("sdpa")
    assert "rows attention" in blocker("rows") and "transformers'" in blocker("hf")
    assert "grouped_attention_backward" in blocker("varlen", grouped=True)


def test_own_casts_are_made_inside_and_never_leak_out():
    weight = torch.randn(4, 4)
    with reuse_weight_casts():
        outer = cast_weight(weight, torch.bfloat16)
        with own_weight_casts():
            inner = cast_weight(weight, torch.bfloat16)
            assert inner is not outer and cast_weight(weight, torch.bfloat16) is inner
        assert cast_weight(weight, torch.bfloat16) is outer


# ---- the trainer's step through StepGraphs, with the CUDA calls stood in for -------------------------------------


class _Recording:
    """Stand-ins for the CUDA calls `StepGraphs` makes. A recording computes nothing: the gradients are put back
    as they were when it closes; a replay runs the recorded pass again and writes its loss into the recorded
    output, as a graph writes its outputs where they were recorded."""

    def __init__(self, fail: str | None = None):
        self.fail, self.open, self.recorded = fail, None, 0

    def graph(self, graph, pool=None, stream=None, capture_error_mode="global"):
        @contextlib.contextmanager
        def recording():
            if self.fail:
                raise RuntimeError(self.fail)
            before = {id(p): p.grad.clone() for p in self.params}
            self.open = graph
            try:
                yield
            finally:
                self.open = None
                for p in self.params:
                    p.grad.copy_(before[id(p)])
                self.recorded += 1

        return recording()

    def wrap(self, pass_):
        def recorded_pass(batch, divisor):
            summed = pass_(batch, divisor)
            if self.open is not None:  # what replay runs: the same pass on the same (static) tensors
                graph, out = self.open, summed.detach()
                graph.replay = lambda: out.copy_(pass_(batch, divisor).detach())
            return summed

        return recorded_pass


@pytest.fixture
def stand_in_cuda(monkeypatch):
    recording = _Recording()
    stream = SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(replay=None))
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: recording.graph(*a, **k))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2**20)
    # the model choice on a CPU says "needs an NVIDIA GPU": let these runs record anyway
    real = graph_choice.model_choice
    monkeypatch.setattr(
        graph_choice, "model_choice", lambda mode, device, **facts: real(mode, "cuda", **facts) if mode == "on" else
        real(mode, device, **facts)
    )  # fmt: skip
    # and the CPU's block-mask attention stands in for the varlen kernel (these batches repeat: the mask built
    # for the recorded batch is every step's)
    monkeypatch.setattr(paths, "_attention_blocker", lambda model, setup: None)
    return recording


def _runner(graphs: str, tokens: int, recording: _Recording | None = None) -> HoneRunner:
    variant = Variant("all", {**ALL_ON, "cuda_graphs": graphs}, "test")
    batch = make_batch(tokens, 100, seed=3, min_len=16, max_len=300)
    runner = HoneRunner(
        variant, get_scenario("tiny-dense"), None, batch, lora_r=4, seed=0, dtype=torch.float32, device="cpu"
    )
    runner.setup()
    if recording is not None:
        graphs_ = runner.runner.graphs
        recording.params = graphs_.params
        graphs_.pass_ = recording.wrap(graphs_.pass_)
    return runner


def _train(runner: HoneRunner, steps: int) -> list:
    try:
        return [runner.step() for _ in range(steps)]
    finally:
        runner.teardown()


@pytest.mark.parametrize("tokens", [1024, 1000])  # on a token bucket; padded with filler sequences
def test_steps_replayed_train_as_the_eager_ones(stand_in_cuda, tokens):
    want = _train(_runner("off", tokens), 4)
    runner = _runner("on", tokens, stand_in_cuda)
    graphs = runner.runner.graphs
    got = _train(runner, 4)
    assert runner.runner is None and graphs.failed is None
    assert (graphs.stats.eager, graphs.stats.recorded, graphs.stats.replays) == (1, 1, 3)
    assert graphs.take_replayed_peak() == 2**20 and graphs.take_replayed_peak() == 0  # the eager pass's peak
    for w, g in zip(want, got, strict=True):
        assert g.loss == pytest.approx(w.loss, rel=1e-5) and g.grad_norm == pytest.approx(w.grad_norm, rel=1e-4)


def test_a_recording_that_fails_leaves_the_run_training_eagerly_and_says_why(stand_in_cuda):
    stand_in_cuda.fail = "operation not permitted when stream is capturing"
    want = _train(_runner("off", 1000), 3)
    runner = _runner("on", 1000, stand_in_cuda)
    graphs, setup = runner.runner.graphs, runner.setup_state
    got = _train(runner, 3)
    assert graphs.failed is not None and "not permitted" in graphs.failed and graphs.stats.replays == 0
    warning = next(n for n in setup.notices if n.topic == "cuda_graphs")
    assert warning.level == "warning" and "not permitted" in warning.message
    for w, g in zip(want, got, strict=True):
        assert g.loss == pytest.approx(w.loss, rel=1e-5)


def test_gradients_replaced_from_outside_are_recorded_again(stand_in_cuda):
    runner = _runner("on", 1000, stand_in_cuda)
    graphs = runner.runner.graphs
    try:
        losses = [runner.step().loss for _ in range(3)]
        runner.runner.optimizer.zero_grad(set_to_none=True)
        losses += [runner.step().loss for _ in range(2)]
    finally:
        runner.teardown()
    assert graphs.stats.dropped == 1 and graphs.stats.recorded == 2 and graphs.stats.replays == 4
    assert losses[-1] < losses[0]


def test_the_runs_choice_names_graphs_on_a_gpu_only():
    runner = _runner("auto", 256)
    try:
        assert runner.runner.graphs is None
        assert runner.describe()["speed_paths"]["cuda_graphs"] == "off: CUDA graphs need an NVIDIA GPU"
    finally:
        runner.teardown()


def test_auto_keeps_layer_inputs_on_the_gpu_where_that_lets_the_steps_be_recorded():
    from hone.core.speed.checkpointing.policy import ModeChoice

    offload = ModeChoice("offload-double", "rows long enough for the copy to hide")
    setup = SimpleNamespace(attention=SimpleNamespace(name="varlen", varlen=None))
    info = SimpleNamespace(params=600_000_000, is_moe=False, is_vision=False)

    def chosen(blocker=None, **speed):
        cfg = SpeedConfig(**speed)
        return paths._checkpoint_for_graphs(torch.nn.Linear(2, 2), cfg, offload, info, "cuda", setup, blocker)

    assert chosen().mode == "gpu" and "CUDA graphs" in chosen().reason
    assert chosen(checkpoint="offload-double") is offload  # asked for by name: kept
    assert chosen(cuda_graphs="off") is offload
    assert chosen("train.optimizer = adamw-bf16 takes each gradient away as it is made") is offload


@pytest.mark.parametrize("optimizer, recorded", [("adamw", True), ("adamw-bf16", False)])
def test_the_planner_counts_a_run_as_the_trainer_will_run_it(optimizer, recorded):
    from hone.core.config import RunConfig, TrainConfig
    from hone.core.memory.run_plan import settings_from_config
    from hone.core.models.shapes import make_config

    config = RunConfig(train=TrainConfig(batch_tokens=16384, optimizer=optimizer))
    settings, _ = settings_from_config(config, make_config("dense-0.6b"), cuda=True, mean_row_tokens=2048)
    # auto offloads this model's inputs at 2K-token rows unless the steps can be recorded
    assert settings.checkpoint == ("gpu" if recorded else "offload-double")
    assert settings.host_embeddings is settings.host_lm_head is (not recorded)  # recorded steps read them on the GPU


def test_a_fit_that_moves_tables_or_checkpoints_to_the_host_turns_the_graphs_off():
    from hone.core.config import RunConfig, TrainConfig
    from hone.core.memory.estimate import estimate_peak
    from hone.core.memory.fit import HEADROOM, auto_fit
    from hone.core.memory.run_plan import settings_from_config
    from hone.core.memory.shape import ModelShape
    from hone.core.models.shapes import make_config

    hf = make_config("dense-0.6b")
    config = RunConfig(train=TrainConfig(batch_tokens=65536))
    settings, _ = settings_from_config(config, hf, cuda=True, mean_row_tokens=2048)
    assert settings.cuda_graphs and settings.checkpoint == "gpu"
    shape = ModelShape.from_config(hf)
    need = estimate_peak(shape, settings).peak_bytes
    # a little short of what the step needs: the first lever (the tables to the host) is enough
    fit = auto_fit(shape, settings, available_bytes=need * 0.99 / (1 - HEADROOM), longest_row=2048)
    assert fit.fits and not fit.settings.cuda_graphs, fit
    assignments = fit.assignments(settings)
    assert 'speed.cuda_graphs="off"' in assignments and "speed.host_embeddings=true" in assignments
    fitted, _ = settings_from_config(config.with_overrides(assignments), hf, cuda=True, mean_row_tokens=2048)
    assert fitted.host_embeddings and not fitted.cuda_graphs  # what the trainer will run is what was fitted

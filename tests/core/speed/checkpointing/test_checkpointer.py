"""Activation checkpointing on the CPU: every mode gives the loss and LoRA gradients of training without
checkpointing (exactly: the CPU kernels are deterministic); the offload bookkeeping (host slots, reload buffers,
prefetch order, fallback to one buffer) runs here with synchronous copies; the CUDA modes degrade to `gpu` recompute
with a Notice in a real run; `auto` follows the copy / compute cost model."""

from __future__ import annotations

import gc

import pytest
import torch

from hone.core import events
from hone.core.config import SpeedConfig
from hone.core.machine.pinned_memory import torch_pinned_bytes
from hone.core.models.shapes import build_model, make_config
from hone.core.speed.checkpointing.checkpointer import (
    Checkpointer,
    apply_checkpointing,
    decoder_layers,
    is_recomputing,
    revert_checkpointing,
)
from hone.core.speed.checkpointing.offload_buffers import (
    HostSlots,
    SyncCopier,
    reload_buffer_bytes,
    second_buffer_decision,
    tight_memory_reason,
)
from hone.core.speed.checkpointing.policy import (
    H2D_BYTES_PER_S,
    LAYER_FLOPS_PER_S,
    MAX_COPY_RATIO,
    SINGLE_BUFFER_RATIO,
    choose_mode,
    layer_cost,
)
from tests.helpers.offload import chain_grads, layer_call_counter, lora_model, loss_and_grads, packed_batch, toy_chain

MiB, GiB = 2**20, 2**30
MODES = ("gpu", "offload", "offload-double")


@pytest.fixture(scope="module")
def lora_models():
    """(shape, attention) -> the same peft LoRA model for every test of this module (tests revert what they apply).
    attention "hf" keeps transformers' own; "sdpa" installs Hone's packed-attention backend, which reads
    cu_seq_lens_q/k from the kwargs every layer passes on."""
    from hone.core.speed import attention

    made = {}

    def get(shape, backend="hf"):
        if (shape, backend) not in made:
            base = build_model(shape)
            if backend != "hf":
                assert attention.configure(base, SpeedConfig(attention=backend), "cpu").name == backend
            # peft refuses dropout on MoE expert parameters; the dense models check the dropout-mask replay.
            made[shape, backend] = lora_model(base, dropout=0.0 if "moe" in shape else 0.1)
        return made[shape, backend]

    return get


# ---------------------------------------------------------------------------------------------------------------
# Equality with training without checkpointing, on real tiny models
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "backend"), [("tiny-dense", "sdpa"), ("tiny-llama", "hf"), ("tiny-moe-qwen3", "sdpa")]
)
def test_every_mode_gives_the_loss_and_lora_gradients_of_no_checkpointing(shape, backend, lora_models):
    model = lora_models(shape, backend)
    batch = packed_batch([23, 41, 9])  # packed: cu_seq_lens_q/k and max_length_q/k flow through every layer
    ref_loss, ref = loss_and_grads(model, batch)
    assert len(ref) > 0 and all(g.abs().sum() > 0 for g in ref.values()), "the reference must train every adapter"
    layers = len(decoder_layers(model))
    hidden = model.config.hidden_size
    counts, remove = layer_call_counter(model)
    try:
        for mode in MODES:
            checkpointer = apply_checkpointing(model, mode, "cpu")
            counts[0] = 0
            loss, grads = loss_and_grads(model, batch)
            metrics = checkpointer.read_and_reset()
            revert_checkpointing(model)
            assert counts[0] == 2 * layers, f"{mode}: each layer should run once forward and once recomputed"
            assert torch.equal(loss, ref_loss), f"{mode}: loss {loss.item()} != {ref_loss.item()}"
            for name, expected in ref.items():
                diff = (grads[name] - expected).abs().max().item()
                assert torch.equal(grads[name], expected), f"{mode}: gradient of {name} differs by {diff}"
            if mode == "gpu":
                assert metrics == dict(offload_bytes=0, copy_stall_s=0.0, buffer_bytes=0)
                continue
            input_bytes = batch.num_tokens * hidden * 4  # fp32 layer inputs
            assert metrics["offload_bytes"] == layers * input_bytes
            assert len(checkpointer.host.slots) == layers
            assert len(checkpointer.buffers) == (2 if mode == "offload-double" else 1)
            assert metrics["buffer_bytes"] == len(checkpointer.buffers) * reload_buffer_bytes(input_bytes)
    finally:
        remove()


def test_qlora_4bit_base_matches_without_checkpointing(tmp_path):
    """QLoRA: a bitsandbytes nf4 base under LoRA recomputes to the same loss and gradients."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    build_model("tiny-llama").save_pretrained(tmp_path)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    try:
        base = AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=quant, device_map={"": "cpu"})
    except (RuntimeError, ValueError, ImportError) as e:
        pytest.skip(f"bitsandbytes 4-bit does not load on this CPU: {e}")
    model = lora_model(base)
    assert "Linear4bit" in type(decoder_layers(model)[0].self_attn.q_proj.base_layer).__name__
    batch = packed_batch([19, 30])
    ref_loss, ref = loss_and_grads(model, batch)
    for mode in ("gpu", "offload-double"):
        apply_checkpointing(model, mode, "cpu")
        loss, grads = loss_and_grads(model, batch)
        revert_checkpointing(model)
        assert torch.equal(loss, ref_loss), mode
        for name, expected in ref.items():
            assert torch.equal(grads[name], expected), f"{mode}: {name}"


# ---------------------------------------------------------------------------------------------------------------
# The checkpoint function on a chain of toy layers: buffers, prefetch order, growth, fallback
# ---------------------------------------------------------------------------------------------------------------


class LoggingCopier(SyncCopier):
    """Synchronous copies that record which buffer every reload went into."""

    def __init__(self):
        super().__init__()
        self.reloads: list[int] = []

    def to_device(self, src, dst):
        self.reloads.append(dst.untyped_storage().data_ptr())
        return super().to_device(src, dst)


@pytest.mark.parametrize("mode", MODES)
def test_the_last_layers_kept_run_once_and_train_the_same(mode, lora_models):
    """speed.keep_layer_activations: the last layers run plainly (their forward once), the others are recomputed;
    loss and gradients are those of no checkpointing, and only the recomputed layers' inputs are saved."""
    model = lora_models("tiny-llama", "hf")
    batch = packed_batch([23, 41, 9])
    ref_loss, ref = loss_and_grads(model, batch)
    layers = decoder_layers(model)
    counts, remove = layer_call_counter(model)
    try:
        for kept in (1, len(layers), len(layers) + 5):  # more than the model has: every layer kept
            checkpointer = apply_checkpointing(model, mode, "cpu", kept_layers=kept)
            counts[0] = 0
            loss, grads = loss_and_grads(model, batch)
            metrics = checkpointer.read_and_reset()
            flags = [layer.gradient_checkpointing for layer in layers]
            revert_checkpointing(model)
            recomputed = len(layers) - min(kept, len(layers))
            assert checkpointer.kept_layers == len(layers) - recomputed
            assert flags == [True] * recomputed + [False] * (len(layers) - recomputed)  # the last ones are kept
            assert counts[0] == len(layers) + recomputed
            assert torch.equal(loss, ref_loss)
            assert all(torch.equal(grads[name], expected) for name, expected in ref.items())
            if mode != "gpu":
                assert metrics["offload_bytes"] == recomputed * batch.num_tokens * model.config.hidden_size * 4
    finally:
        remove()
    assert all(not layer.__dict__.get("gradient_checkpointing", False) for layer in layers)  # reverted


def test_double_buffering_reloads_each_input_once_into_alternating_buffers():
    layers, x = toy_chain(4), torch.randn(1, 50, 256)
    ref_loss, ref = chain_grads(layers, x)
    checkpointer = Checkpointer("offload-double", "cpu")
    checkpointer.copier = LoggingCopier()
    loss, grads = chain_grads(layers, x, checkpointer)
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))
    first, second = (b.data.data_ptr() for b in checkpointer.buffers)
    # layer 3 is loaded, layer 2 prefetched into the other buffer while 3 recomputes, then 1, then 0.
    assert checkpointer.copier.reloads == [first, second, first, second]
    assert all(not slot.in_use for slot in checkpointer.host.slots)

    single = Checkpointer("offload", "cpu")
    single.copier = LoggingCopier()
    chain_grads(layers, x, single)
    assert len(single.buffers) == 1 and single.copier.reloads == [single.buffers[0].data.data_ptr()] * 4


def test_recomputes_are_told_apart_from_forwards():
    """Meters hooked on a layer's forward (MoE expert load) must not count the recompute twice."""
    layers, x = toy_chain(2), torch.randn(1, 10, 256)
    seen = []
    handles = [layer.register_forward_hook(lambda *_: seen.append(is_recomputing())) for layer in layers]
    chain_grads(layers, x, Checkpointer("gpu", "cpu"))
    for handle in handles:
        handle.remove()
    assert seen == [False, False, True, True] and not is_recomputing()


def test_buffers_are_reused_across_steps_and_grow_for_a_bigger_batch():
    layers = toy_chain(3, width=1024)
    checkpointer = Checkpointer("offload-double", "cpu")
    sizes = []
    for tokens in (100, 700, 300, 700):  # fp32 inputs of 0.4, 2.7, 1.2, 2.7 MiB
        x = torch.randn(1, tokens, 1024, generator=torch.Generator().manual_seed(tokens))
        ref_loss, ref = chain_grads(layers, x)
        loss, grads = chain_grads(layers, x, checkpointer)
        assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True)), tokens
        metrics = checkpointer.read_and_reset()
        assert metrics["offload_bytes"] == 3 * tokens * 1024 * 4
        sizes.append(
            (
                len(checkpointer.host.slots),
                sorted(s.capacity for s in checkpointer.host.slots),
                [b.capacity for b in checkpointer.buffers],
            )
        )
    assert sizes[0] == (3, [1 * MiB] * 3, [2 * MiB] * 2)
    grown = (3, [4 * MiB] * 3, [4 * MiB] * 2)  # 700 x 1024 x 4 bytes = 2.73 MiB
    assert sizes[1] == grown and sizes[2] == grown and sizes[3] == grown


def test_double_falls_back_to_one_buffer_when_buffer_memory_is_limited():
    layers, x = toy_chain(4), torch.randn(1, 50, 256)  # 50 KiB inputs: 2 MiB buffers
    ref_loss, ref = chain_grads(layers, x)
    notes = []
    checkpointer = Checkpointer(
        "offload-double",
        "cpu",
        max_buffer_bytes=3 * MiB,
        note=lambda topic, message, level: notes.append((topic, message, level)),
    )
    loss, grads = chain_grads(layers, x, checkpointer)
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))
    assert checkpointer.mode == "offload" and len(checkpointer.buffers) == 1
    assert len(notes) == 1
    topic, message, level = notes[0]
    assert topic == "checkpoint" and level == "warning"
    assert "one reload buffer" in message and "two reload buffers need 4 MiB, over the 3 MiB allowed" in message
    chain_grads(layers, x, checkpointer)  # later steps: still one buffer, no second notice
    assert len(notes) == 1 and len(checkpointer.buffers) == 1


def test_inputs_that_need_gradients_besides_the_hidden_state_still_get_them():
    layers, x = toy_chain(2), torch.randn(1, 20, 256)
    scale = torch.tensor(1.5, requires_grad=True)
    ref_loss, ref = chain_grads(layers, x, scale=scale)
    loss, grads = chain_grads(layers, x, Checkpointer("offload-double", "cpu"), scale=scale)
    assert torch.equal(loss, ref_loss)
    assert all(torch.allclose(g, r, rtol=1e-6, atol=1e-7) for g, r in zip(grads, ref, strict=True))
    assert ref[-1].abs() > 0


def test_a_graph_dropped_without_backward_gives_its_host_slots_back():
    layers, x = toy_chain(3), torch.randn(1, 20, 256)
    ref_loss, ref = chain_grads(layers, x)
    checkpointer = Checkpointer("offload", "cpu")
    h = x
    for layer in layers:
        h = checkpointer(layer, h)
    assert sum(slot.in_use for slot in checkpointer.host.slots) == 3
    del h
    gc.collect()
    assert sum(slot.in_use for slot in checkpointer.host.slots) == 0
    loss, grads = chain_grads(layers, x, checkpointer)  # the slots serve the next step
    assert len(checkpointer.host.slots) == 3
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))


def test_the_recompute_runs_under_the_forward_autocast():
    """Forward under bf16 autocast, backward outside it (as the trainer does): the recompute must use bf16 again."""
    layers, x = toy_chain(3), torch.randn(1, 30, 256)

    def run(checkpointer):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x
            for layer in layers:
                h = checkpointer(layer, h) if checkpointer is not None else layer(h)
        (h.float() * torch.linspace(-1, 1, 256)).sum().backward()
        grads = [p.grad.clone() for layer in layers for p in layer.parameters()]
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        return grads

    ref = run(None)
    for mode in MODES:
        grads = run(Checkpointer(mode, "cpu"))
        assert all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True)), mode


def test_no_buffer_is_created_under_inference_mode_or_without_grad(lora_models):
    model = lora_models("tiny-llama")
    batch = packed_batch([12, 9])
    ref_loss, ref = loss_and_grads(model, batch)
    checkpointer = apply_checkpointing(model, "offload-double", "cpu")
    try:
        model.train()
        with torch.inference_mode():
            model(**batch.model_inputs())
        with torch.no_grad():
            model(**batch.model_inputs())
        assert checkpointer.host.slots == [] and checkpointer.buffers == []
        loss, grads = loss_and_grads(model, batch)  # training afterwards: no inference tensors in the way
        assert torch.equal(loss, ref_loss) and all(torch.equal(grads[k], v) for k, v in ref.items())
        assert not any(slot.data.is_inference() for slot in checkpointer.host.slots)
        assert not any(b.data.is_inference() for b in checkpointer.buffers)
    finally:
        revert_checkpointing(model)


def test_revert_restores_every_layer(lora_models):
    model = lora_models("tiny-dense")
    layers = decoder_layers(model)
    base = model.get_base_model()
    assert base.config.use_cache is True and not any(layer.gradient_checkpointing for layer in layers)
    checkpointer = apply_checkpointing(model, "offload", "cpu")
    assert all(layer.gradient_checkpointing and layer._gradient_checkpointing_func is checkpointer for layer in layers)
    assert base.config.use_cache is False
    revert_checkpointing(model)
    assert base.config.use_cache is True
    assert not any(
        "gradient_checkpointing" in layer.__dict__ or "_gradient_checkpointing_func" in layer.__dict__
        for layer in layers
    )
    counts, remove = layer_call_counter(model)
    loss_and_grads(model, packed_batch([10]))
    remove()
    assert counts[0] == len(layers), "after revert no layer is recomputed"


# ---------------------------------------------------------------------------------------------------------------
# Sizing and decisions
# ---------------------------------------------------------------------------------------------------------------


def test_buffer_sizes():
    assert torch_pinned_bytes(1) == 1 * MiB and torch_pinned_bytes(MiB + 1) == 2 * MiB
    assert torch_pinned_bytes(128 * MiB) == 128 * MiB and torch_pinned_bytes(96 * MiB) == 128 * MiB
    assert reload_buffer_bytes(1) == 2 * MiB and reload_buffer_bytes(128 * MiB) == 128 * MiB
    assert reload_buffer_bytes(96 * MiB + 1) == 98 * MiB


def test_host_slots_are_reused_regrown_and_added_only_when_all_are_taken():
    pool = HostSlots(pin=False)
    a, b = pool.acquire(100), pool.acquire(3 * MiB)
    assert [s.capacity for s in pool.slots] == [1 * MiB, 4 * MiB]
    HostSlots.release(a)
    HostSlots.release(b)
    assert pool.acquire(100) is a  # the smallest free slot that fits
    HostSlots.release(a)
    assert pool.acquire(2 * MiB) is b
    c = pool.acquire(5 * MiB)  # b is taken, a is free but small: a regrows
    assert c is a and c.capacity == 8 * MiB and len(pool.slots) == 2
    d = pool.acquire(10)  # all taken: a new slot
    assert len(pool.slots) == 3 and d.capacity == 1 * MiB
    assert pool.total_bytes == (8 + 4 + 1) * MiB
    view = c.view(torch.Size([2, 3]), torch.bfloat16)
    assert view.shape == (2, 3) and view.dtype == torch.bfloat16 and view.data_ptr() == c.data.data_ptr()


def test_second_buffer_and_tight_memory_decisions():
    assert second_buffer_decision(128 * MiB, 128 * MiB, None, 10 * GiB, GiB) is None
    assert second_buffer_decision(128 * MiB, 128 * MiB, 512 * MiB, None, GiB) is None
    over = second_buffer_decision(128 * MiB, 128 * MiB, 192 * MiB, None, GiB)
    assert over == "two reload buffers need 256 MiB, over the 192 MiB allowed"
    short = second_buffer_decision(512 * MiB, 512 * MiB, None, GiB + 256 * MiB, GiB)
    assert short is not None and "1.25 GiB of GPU memory is free" in short
    assert tight_memory_reason(2 * GiB, 60 * GiB, 61 * GiB, GiB) is None
    tight = tight_memory_reason(GiB // 2, 60 * GiB, 60 * GiB, GiB)
    assert tight == "memory got tight: only 512 MiB was free at the last step's peak (under 1.00 GiB)"


def test_layer_cost_counts_each_layers_weights_by_hand():
    dense = layer_cost(make_config("dense-0.6b"))  # Qwen3-0.6B: H 1024, 16 x 128 query heads, 8 kv heads, MLP 3072
    assert dense.hidden_size == 1024 and dense.attention_width == 2048
    assert dense.linear_params == 1024 * 2048 * 2 + 1024 * 1024 * 2 + 3 * 1024 * 3072
    moe = layer_cost(make_config("moe-qwen3"))  # 32 x 128 query heads, 4 kv heads, top-8 of 128 experts of 768
    assert moe.linear_params == 2048 * 4096 * 2 + 2048 * 512 * 2 + 8 * 3 * 2048 * 768 + 2048 * 128
    shared = layer_cost(make_config("tiny-moe-qwen2"))  # H 64, 4 x 16 heads, top-2 of 6 experts of 32, shared 64
    assert shared.linear_params == 64 * 64 * 2 + 64 * 32 * 2 + 2 * 3 * 64 * 32 + 64 * 6 + 3 * 64 * 64


def test_auto_follows_the_copy_compute_ratio():
    small, medium, big = make_config("smollm2-135m"), make_config("dense-0.6b"), make_config("dense-8b")
    p_small = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q, o; k, v; gate, up, down

    def ratio_by_hand(p, width, hidden, rows):
        return (hidden * 2 / H2D_BYTES_PER_S) / ((4 * p + 7 * rows * width) / LAYER_FLOPS_PER_S)

    assert layer_cost(small).copy_ratio(512) == pytest.approx(ratio_by_hand(p_small, 576, 576, 512))
    threshold = layer_cost(small).min_row_tokens()
    assert (
        ratio_by_hand(p_small, 576, 576, threshold) <= MAX_COPY_RATIO < ratio_by_hand(p_small, 576, 576, threshold - 1)
    )
    assert 4000 < threshold < 6000  # ~4.8K tokens for a 135M model on the reference GPU

    short = choose_mode("auto", "cuda", 512, small, integrated=False)
    assert short.mode == "gpu" and f"~{threshold} tokens" in short.reason
    assert choose_mode("auto", "cuda", 16384, small, integrated=False).mode == "offload-double"
    # a 0.6B layer's matmuls alone keep the copy under the cap (measured: offload-double as fast as recompute)
    assert layer_cost(medium).min_row_tokens() == 0
    assert choose_mode("auto", "cuda", 565, medium, integrated=False).mode == "offload-double"
    assert layer_cost(big).min_row_tokens() == 0  # an 8B layer's matmuls alone hide the copy 10 times over
    assert choose_mode("auto", "cuda", 256, big, integrated=False).mode == "offload-double"
    # rows so long that one exposed copy is at most 1 % of the recompute: one buffer, a layer input less on the GPU
    assert layer_cost(big).copy_ratio(32768) > SINGLE_BUFFER_RATIO
    assert choose_mode("auto", "cuda", 32768, big, integrated=False).mode == "offload-double"
    assert layer_cost(big).copy_ratio(409_600) <= SINGLE_BUFFER_RATIO
    very_long = choose_mode("auto", "cuda", 409_600, big, integrated=False)
    assert very_long.mode == "offload" and "one reload buffer" in very_long.reason
    on_unified_memory = choose_mode("auto", "cuda", 16384, big, integrated=True)  # DGX Spark: never offload
    assert on_unified_memory.mode == "gpu" and "would free nothing" in on_unified_memory.reason
    assert choose_mode("auto", "cpu", 16384, big).mode == "off"
    for mode in ("off", "gpu", "offload", "offload-double"):
        assert choose_mode(mode, "cuda:0", 10, small).mode == mode  # what the user asks for on a GPU
    assert choose_mode("gpu", "cpu", 10, small).mode == "gpu" and not choose_mode("gpu", "cpu", 10, small).notice


# ---------------------------------------------------------------------------------------------------------------
# In a run on the CPU
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", ["offload", "offload-double"])
def test_cuda_modes_degrade_to_gpu_recompute_on_the_cpu_with_a_notice(requested, lora_models):
    from hone.core.model_info import ModelInfo
    from hone.core.speed.paths import SpeedSetup, install_memory_and_kernels

    model = lora_models("tiny-dense")
    setup = SpeedSetup()
    info = ModelInfo("tiny", "folder", "Qwen3ForCausalLM", "qwen3", 0, 2, 64, 49152, 4096)
    install_memory_and_kernels(model, SpeedConfig(checkpoint=requested), info, "cpu", setup, mean_row_tokens=100.0)
    try:
        assert setup.choices["checkpoint"].startswith("gpu:")
        assert [(n.topic, n.level) for n in setup.notices] == [("checkpoint", "warning")]
        assert f"speed.checkpoint = {requested} needs a CUDA GPU" in setup.notices[0].message
        assert isinstance(setup.offload, Checkpointer) and setup.offload.mode == "gpu"
        assert all(layer._gradient_checkpointing_func is setup.offload for layer in decoder_layers(model))
    finally:
        revert_checkpointing(model)
    for requested_off in ("auto", "off"):
        setup = SpeedSetup()
        install_memory_and_kernels(
            model, SpeedConfig(checkpoint=requested_off), info, "cpu", setup, mean_row_tokens=100.0
        )
        assert setup.choices["checkpoint"].startswith("off:") and setup.offload is None and not setup.notices


def test_a_training_run_reports_the_degrade_and_the_offload_metrics(tiny_model_dir, chat_files, tiny_config, tmp_path):
    from hone.core.train.trainer import Trainer

    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path,
        "speed.checkpoint=offload-double",
        "train.max_steps=1",
        "data.eval=[]",
    )
    got = list(Trainer(config, device="cpu").run())
    assert not any(isinstance(e, events.RunFailed) for e in got), got[-1]
    notices = [e for e in got if isinstance(e, events.Notice) and e.topic == "checkpoint"]
    assert len(notices) == 1 and notices[0].level == "warning" and "needs a CUDA GPU" in notices[0].message
    started = next(e for e in got if isinstance(e, events.RunStarted))
    assert started.speed_paths["checkpoint"].startswith("gpu:")
    step = next(e for e in got if isinstance(e, events.StepMetrics))
    assert (step.offload_bytes, step.copy_stall_s, step.buffer_bytes) == (0, 0.0, 0)

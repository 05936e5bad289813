"""Offloaded checkpoints on a CUDA GPU (`pytest -m gpu`).

First the copy primitives against a compute stream kept busy with `torch.cuda._sleep` (each ordering rule of
`CudaCopier` on its own: a missing one fails there deterministically, whatever else passes); then a toy chain whose
layers sleep (copies and compute far apart in time); then a 1B-shaped model: every reloaded layer input
byte-identical to the saved one (`verify`), the loss and LoRA gradients equal training without checkpointing, a
stress run with varying row lengths equal at every step (a race shows up as an error that moves), the fallback to
one buffer, the step metrics, the memory saved, QLoRA and MoE layers. A gradient mismatch reports the error per
decoder layer (the highest wrong layer is where backward first went wrong) and a `verify` re-run per layer.

bf16 kernels are not bit-reproducible (attention backward accumulates atomically), so model comparisons are against
a noise floor measured in the same test: the reference computed twice."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.speed.checkpointing.checkpointer import (
    Checkpointer,
    apply_checkpointing,
    decoder_layers,
    revert_checkpointing,
)
from hone.core.speed.checkpointing.offload_buffers import (
    CudaCopier,
    HostSlots,
    allocate_reload_buffer,
    reload_buffer_bytes,
)
from hone.core.train.loss import loss_sum
from tests.helpers.offload import ToyLayer, chain_grads, lora_model, loss_and_grads, packed_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Relative error allowed on top of the measured noise floor: bf16 rounding differences of a legitimately different
# kernel choice stay near 1e-3; a layer recomputed from a wrong or half-copied input is off by tens of percent.
MIN_TOLERANCE = 5e-3
NOISE_FACTOR = 5.0


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def worst_error(loss, grads, ref_loss, ref) -> tuple[float, str]:
    errors = {name: rel_error(grads[name], ref[name]) for name in ref}
    errors["loss"] = rel_error(loss, ref_loss)
    name = max(errors, key=errors.get)
    return errors[name], name


def per_layer_errors(grads, ref) -> str:
    """The worst relative gradient error of each decoder layer, last layer first (backward's order)."""
    worst: dict[int, float] = {}
    for name in ref:
        found = re.search(r"\.layers\.(\d+)\.", name)
        if found:
            layer = int(found.group(1))
            worst[layer] = max(worst.get(layer, 0.0), rel_error(grads[name], ref[name]))
    return ", ".join(f"layers.{i} {worst[i]:.1e}" for i in sorted(worst, reverse=True))


def verify_report(model, batch, mode: str) -> str:
    """Run one step with `verify` on: which layer inputs came back different from how they were saved, and where."""
    checkpointer = apply_checkpointing(model, mode, "cuda", verify=True)
    try:
        loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
    finally:
        revert_checkpointing(model)
    bad = [
        f"{c.layer} {c.where}: {c.differing_bytes} of {c.nbytes} bytes differ"
        for c in checkpointer.integrity
        if c.differing_bytes
    ]
    return "; ".join(bad) if bad else f"all {len(checkpointer.integrity)} reload checks byte-identical"


def diagnosis(model, batch, mode, grads, ref) -> str:
    return (
        f"\n  per layer: {per_layer_errors(grads, ref)}\n  verify re-run ({mode}): {verify_report(model, batch, mode)}"
    )


# ---------------------------------------------------------------------------------------------------------------
# The copy primitives against a busy compute stream
# ---------------------------------------------------------------------------------------------------------------

# GPU clock cycles `torch.cuda._sleep` spins: ~50 ms at an H200's ~2 GHz, far longer than the CPU needs to queue
# everything after it, so work queued later on another stream runs first unless something orders it.
SLEEP_CYCLES = 100_000_000
COPY_FLOATS = 8 << 20  # 32 MiB copies: whole 2 MiB pages, so a reload buffer takes exactly a freed block's size


def test_a_reload_into_fresh_memory_waits_for_compute_work_still_writing_that_memory():
    """The first H200 run's bug: the allocator hands a block freed on the compute stream straight to the next
    allocation, while kernels queued earlier still write it; a reload on the side stream must wait for them."""
    device = torch.device("cuda")
    copier = CudaCopier(device)
    pinned = torch.full((COPY_FLOATS,), 1.0).pin_memory()
    torch.cuda.synchronize()
    scratch = torch.empty(COPY_FLOATS, device=device)
    freed_at = scratch.data_ptr()
    torch.cuda._sleep(SLEEP_CYCLES)
    scratch.fill_(7.0)  # queued behind the sleep: it writes the block long after the CPU moved on
    del scratch
    buffer = allocate_reload_buffer(device, COPY_FLOATS * 4, copier)
    reused = buffer.data_ptr() == freed_at
    target = buffer.view(torch.float32)[:COPY_FLOATS]
    copier.wait(copier.to_device(pinned, target))
    wrong = int((target != 1.0).sum())
    assert wrong == 0, (
        f"{wrong} of {COPY_FLOATS} reloaded values were overwritten by compute work queued before the "
        f"buffer was allocated (buffer {'reused' if reused else 'did not reuse'} the freed block)"
    )


def test_an_offload_copies_the_input_as_produced_and_its_memory_is_not_reused_before():
    device = torch.device("cuda")
    copier = CudaCopier(device)
    host = torch.empty(COPY_FLOATS, pin_memory=True)
    torch.cuda.synchronize()
    src = torch.empty(COPY_FLOATS, device=device)
    torch.cuda._sleep(SLEEP_CYCLES)
    src.fill_(3.0)  # the layer input is produced after a long queue of work
    with torch.cuda.stream(copier.stream):
        torch.cuda._sleep(2 * SLEEP_CYCLES)  # and the side stream is busier: the copy runs after all of that
    copier.to_host(src, host)
    del src  # the input's memory goes back to the allocator; the compute stream allocates and writes right away
    later = torch.empty(COPY_FLOATS, device=device)
    later.fill_(9.0)
    torch.cuda.synchronize()
    wrong = int((host != 3.0).sum())
    assert wrong == 0, (
        f"{wrong} of {COPY_FLOATS} offloaded values are not the input's (3.0): {host.unique()[:5].tolist()} found"
    )


class SleepyLayer(ToyLayer):
    """A toy residual layer that keeps the GPU busy before computing, so copies and compute drift apart."""

    def forward(self, h, scale=None):
        torch.cuda._sleep(SLEEP_CYCLES // 10)
        return super().forward(h, scale)


@pytest.mark.parametrize("mode", ["offload", "offload-double"])
def test_a_slow_toy_chain_reloads_exactly_what_it_saved(mode):
    """fp32 toy layers that sleep ~5 ms each: three steps with inputs that grow and shrink, gradients against gpu
    recompute (same kernels on the same inputs: equal up to kernel selection) and every reloaded byte against the
    saved one."""
    layers = [SleepyLayer(1024, seed).cuda() for seed in range(6)]
    checkpointer = Checkpointer(mode, "cuda", verify=True)
    checkpointer.layer_names = {id(layer): f"layers.{i}" for i, layer in enumerate(layers)}
    plain = Checkpointer(mode, "cuda")
    for tokens in (1000, 3000, 2000):
        x = torch.randn(1, tokens, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens))
        ref_loss, ref = chain_grads(layers, x, Checkpointer("gpu", "cuda"))
        for name, ck in (("plain", plain), ("verify", checkpointer)):
            loss, grads = chain_grads(layers, x, ck)
            errors = [rel_error(g, r) for g, r in zip(grads, ref, strict=True)]
            assert max(errors) <= 1e-4 and rel_error(loss, ref_loss) <= 1e-5, (
                f"{mode} ({name}), {tokens} tokens: relative errors per parameter {[f'{e:.1e}' for e in errors]}"
            )
    bad = [
        f"{c.layer} {c.where}: {c.differing_bytes} of {c.nbytes} bytes"
        for c in checkpointer.integrity
        if c.differing_bytes
    ]
    assert not bad, "\n".join(bad)
    assert len(checkpointer.integrity) == 3 * 6 * 3


@pytest.fixture(scope="module")
def llama_1b():
    torch.manual_seed(0)
    model = with_run_attention(build_model("llama-1b", layers=6, dtype=torch.bfloat16, device="cuda"))
    yield lora_model(model, rank=16)
    revert_checkpointing(model)


def with_run_attention(model):
    """The packed-attention backend a run would pick (varlen on an H200), reading cu_seq_lens from the kwargs."""
    choice = attention.configure(model, SpeedConfig(), "cuda")
    print(f"attention: {choice.name} ({choice.reason})")
    return model


def reference(model, batch):
    """Loss and grads without checkpointing, twice; returns them and the noise floor between the two."""
    revert_checkpointing(model)
    loss, grads = loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
    loss2, grads2 = loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
    noise, _ = worst_error(loss2, grads2, loss, grads)
    return loss, grads, max(MIN_TOLERANCE, NOISE_FACTOR * noise)


@pytest.mark.parametrize("mode", ["offload", "offload-double"])
def test_1b_loss_and_gradients_equal_training_without_checkpointing(llama_1b, mode):
    batch = packed_batch([1500, 700, 1800], vocab=128256)
    ref_loss, ref, tolerance = reference(llama_1b, batch)
    for name in ("gpu", mode):  # gpu recompute as a control: the same tolerance must hold for it
        checkpointer = apply_checkpointing(llama_1b, name, "cuda")
        loss, grads = loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
        checkpointer.read_and_reset()
        revert_checkpointing(llama_1b)
        error, where = worst_error(loss, grads, ref_loss, ref)
        if error > tolerance:
            pytest.fail(
                f"{name}: relative error {error:.2e} in {where} (tolerance {tolerance:.2e})"
                + diagnosis(llama_1b, batch, name, grads, ref)
            )


@pytest.mark.parametrize("kernels", [False, True])
def test_1b_layers_back_propagated_in_sequence_groups_equal_training_without_checkpointing(llama_1b, kernels):
    """`hone.core.speed.checkpointing.layer_groups` on the GPU: groups [1500] [700] [1800] of at most 1,024 tokens (a
    longer sequence is
    a group of its own), with offloaded inputs; with Hone's kernels, each group's MLP also in MLP tiles."""
    from hone.core.speed.fused.apply import apply_kernels, revert_kernels

    batch = packed_batch([1500, 700, 1800], vocab=128256)
    ref_loss, ref, tolerance = reference(llama_1b, batch)
    if kernels:
        apply_kernels(llama_1b, tile_mlp=True)
        ref_loss, ref, tolerance = reference(llama_1b, batch)  # the kernels' own rounding is the reference here
    try:
        checkpointer = apply_checkpointing(llama_1b, "offload-double", "cuda", group_tokens=1024)
        loss, grads = loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
        checkpointer.read_and_reset()
        revert_checkpointing(llama_1b)
    finally:
        if kernels:
            revert_kernels(llama_1b)
    assert checkpointer.grouped_layers == len(decoder_layers(llama_1b))
    error, where = worst_error(loss, grads, ref_loss, ref)
    if error > tolerance:
        pytest.fail(f"groups: relative error {error:.2e} in {where} (tolerance {tolerance:.2e})")


@pytest.mark.parametrize("mode", ["gpu", "offload", "offload-double"])
def test_1b_every_reloaded_input_is_byte_identical_to_the_saved_one(llama_1b, mode):
    """`verify`: each layer's input compared, as the forward saw it, with the pinned host copy, the reload buffer
    the recompute reads, and that buffer again after the layer's backward (nothing overwrote it meanwhile)."""
    batches = [packed_batch([1500, 700, 1800], vocab=128256), packed_batch([5000], seed=1, vocab=128256)]
    checkpointer = apply_checkpointing(llama_1b, mode, "cuda", verify=True)
    try:
        for batch in batches:  # the second batch is bigger: buffers regrow
            loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
    finally:
        revert_checkpointing(llama_1b)
    layers = len(decoder_layers(llama_1b))
    stages = 1 if mode == "gpu" else 3
    assert len(checkpointer.integrity) == stages * layers * len(batches), checkpointer.integrity
    bad = [
        f"{c.layer} {c.where} (input #{c.seq}): {c.differing_bytes} of {c.nbytes} bytes differ"
        for c in checkpointer.integrity
        if c.differing_bytes
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mode", ["offload", "offload-double"])
def test_stress_many_steps_with_varying_rows_stay_equal_every_step(llama_1b, mode):
    """60 steps, 1-3 micro-batches each of 300-7000 tokens in 1-4 rows: buffers regrow and are reused, copies and
    recomputes interleave; every step's gradients are compared with a reference computed without checkpointing."""
    generator = torch.Generator().manual_seed(11)
    layers = decoder_layers(llama_1b)
    checkpointer = apply_checkpointing(llama_1b, mode, "cuda")
    errors, largest = [], 0
    try:
        for step in range(60):
            micro = int(torch.randint(1, 4, (1,), generator=generator))
            batches = []
            for _ in range(micro):
                rows = int(torch.randint(1, 5, (1,), generator=generator))
                lengths = torch.randint(300 // rows, 7000 // rows, (rows,), generator=generator).tolist()
                batches.append(packed_batch(lengths, seed=step * 10 + len(batches), vocab=128256))
            for layer in layers:  # the reference: the same layers, checkpointing switched off for this pass
                layer.gradient_checkpointing = False
            ref, again = accumulate(llama_1b, batches), accumulate(llama_1b, batches)
            for layer in layers:
                layer.gradient_checkpointing = True
            got = accumulate(llama_1b, batches)
            metrics = checkpointer.read_and_reset()
            noise, _ = worst_error(*again, *ref)
            tolerance = max(MIN_TOLERANCE, NOISE_FACTOR * noise)
            error, where = worst_error(*got, *ref)
            errors.append(error)
            if error > tolerance:
                pytest.fail(
                    f"step {step}: relative error {error:.2e} in {where} (tolerance {tolerance:.2e}); errors "
                    f"so far {[f'{e:.1e}' for e in errors]}; batches {[b.num_tokens for b in batches]} tokens"
                    f"\n  per layer: {per_layer_errors(got[1], ref[1])}"
                )
            largest = max(largest, max(b.num_tokens for b in batches) * llama_1b.config.hidden_size * 2)
            tokens = sum(b.num_tokens for b in batches)
            hidden = llama_1b.config.hidden_size
            assert metrics["offload_bytes"] == len(layers) * tokens * hidden * 2, metrics
    finally:
        revert_checkpointing(llama_1b)
    assert checkpointer.mode == mode, checkpointer.notes
    assert [b.capacity for b in checkpointer.buffers] == [reload_buffer_bytes(largest)] * len(checkpointer.buffers)


def accumulate(model, batches):
    """Loss summed and gradients accumulated over micro-batches (one optimizer step's worth)."""
    model.train()
    total = torch.zeros((), device="cuda")
    for batch in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_sum(model, batch.to("cuda"))
        loss.backward()
        total += loss.detach().float()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return total, grads


def test_metrics_memory_saving_and_copy_stalls(llama_1b):
    batch = packed_batch([4096, 4096], vocab=128256)
    layers, hidden = len(decoder_layers(llama_1b)), llama_1b.config.hidden_size
    input_bytes = batch.num_tokens * hidden * 2
    results = {}
    for mode in ("gpu", "offload", "offload-double"):
        checkpointer = apply_checkpointing(llama_1b, mode, "cuda")
        loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)  # first step: buffers allocated
        checkpointer.read_and_reset()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        results[mode] = dict(checkpointer.read_and_reset(), peak=torch.cuda.max_memory_allocated())
        revert_checkpointing(llama_1b)
    gpu, single, double = results["gpu"], results["offload"], results["offload-double"]
    assert gpu["offload_bytes"] == 0 and gpu["buffer_bytes"] == 0
    for r, buffers in ((single, 1), (double, 2)):
        assert r["offload_bytes"] == layers * input_bytes, r
        assert r["buffer_bytes"] == buffers * reload_buffer_bytes(input_bytes), r
    assert single["copy_stall_s"] > 0, single  # one buffer: compute waits for every reload
    assert double["copy_stall_s"] < single["copy_stall_s"], (double, single)
    saved = gpu["peak"] - double["peak"]
    assert saved >= 0.5 * (layers - 2) * input_bytes, (
        f"offload-double saved {saved / 2**20:.0f} MiB of peak memory; {layers} layer inputs are "
        f"{layers * input_bytes / 2**20:.0f} MiB"
    )


def test_double_falls_back_to_one_buffer_when_buffer_memory_is_limited(llama_1b):
    batch = packed_batch([3000, 1000], vocab=128256)
    ref_loss, ref, tolerance = reference(llama_1b, batch)
    input_bytes = batch.num_tokens * llama_1b.config.hidden_size * 2
    notes = []
    checkpointer = apply_checkpointing(
        llama_1b,
        "offload-double",
        "cuda",
        max_buffer_bytes=reload_buffer_bytes(input_bytes) * 3 // 2,
        note=lambda topic, message, level: notes.append((topic, message, level)),
    )
    try:
        loss, grads = loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
        metrics = checkpointer.read_and_reset()
    finally:
        revert_checkpointing(llama_1b)
    assert checkpointer.mode == "offload" and len(checkpointer.buffers) == 1, checkpointer.notes
    assert metrics["buffer_bytes"] == reload_buffer_bytes(input_bytes)
    assert [(t, lvl) for t, _m, lvl in notes] == [("checkpoint", "warning")], notes
    error, where = worst_error(loss, grads, ref_loss, ref)
    assert error <= tolerance, (
        f"after the fallback: relative error {error:.2e} in {where}\n  per layer: {per_layer_errors(grads, ref)}"
    )


def test_no_buffer_under_inference_mode(llama_1b):
    batch = packed_batch([500, 300], vocab=128256).to("cuda")
    checkpointer = apply_checkpointing(llama_1b, "offload-double", "cuda")
    try:
        llama_1b.train()
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            llama_1b(**batch.model_inputs())
        assert checkpointer.host.slots == [] and checkpointer.buffers == []
        loss_and_grads(llama_1b, batch, autocast_dtype=torch.bfloat16)
        assert checkpointer.host.slots and all(s.data.is_pinned() for s in checkpointer.host.slots)
        assert not any(b.data.is_inference() for b in checkpointer.buffers)
    finally:
        revert_checkpointing(llama_1b)


def _equal_to_reference(model, batch, modes=("offload", "offload-double")):
    ref_loss, ref, tolerance = reference(model, batch)
    for mode in modes:
        apply_checkpointing(model, mode, "cuda")
        loss, grads = loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
        revert_checkpointing(model)
        error, where = worst_error(loss, grads, ref_loss, ref)
        if error > tolerance:
            pytest.fail(
                f"{mode}: relative error {error:.2e} in {where} (tolerance {tolerance:.2e})"
                + diagnosis(model, batch, mode, grads, ref)
            )


def test_qlora_4bit_base(tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    build_model("llama-1b", layers=3, dtype=torch.bfloat16, vocab_size=8192).save_pretrained(tmp_path)
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    base = AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=quant, device_map={"": "cuda"}, dtype=torch.bfloat16
    )
    torch.manual_seed(0)
    _equal_to_reference(lora_model(with_run_attention(base), rank=16), packed_batch([1200, 900], vocab=8192))


def test_moe_layers():
    torch.manual_seed(0)
    model = build_model("moe-qwen3", layers=2, dtype=torch.bfloat16, device="cuda")
    model = lora_model(with_run_attention(model), rank=8)
    _equal_to_reference(model, packed_batch([1000, 600], vocab=151936))


@pytest.mark.parametrize("mode", ["gpu", "offload-double"])
def test_dropout_masks_replay_on_the_gpu_and_the_callers_rng_goes_on_as_without_checkpointing(mode):
    """LoRA dropout drawn from the CUDA generator: the recompute must draw the forward's masks (float32, so any
    other mask shows far above rounding), and the generator must be left where a step without checkpointing
    leaves it."""
    torch.manual_seed(0)
    model = lora_model(build_model("tiny-llama", device="cuda"), dropout=0.1)
    batch = packed_batch([23, 41, 9])
    ref_loss, ref = loss_and_grads(model, batch)
    ref_next = torch.rand(4, device="cuda")
    apply_checkpointing(model, mode, "cuda")
    try:
        loss, grads = loss_and_grads(model, batch)
        after = torch.rand(4, device="cuda")
    finally:
        revert_checkpointing(model)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for name, expected in ref.items():
        torch.testing.assert_close(grads[name], expected, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert torch.equal(after, ref_next), "the recompute left the caller's CUDA generator elsewhere"


def test_large_host_slots_are_registered_page_locked_and_copy_both_ways():
    """A slot over the registered minimum is plain memory registered with CUDA, of the size asked: page-locked
    (copies on the side stream run asynchronously from it) and exact where torch would pin a power of two."""
    pool = HostSlots(pin=True)
    slot = pool.acquire(100 << 20)
    assert pool.register_error == "" and pool.register and slot.unpin is not None
    assert slot.capacity == 100 << 20 and slot.data.is_pinned()
    x = torch.randn(25 << 20, device="cuda")  # 100 MiB of fp32
    copier = CudaCopier(torch.device("cuda"))
    copier.to_host(x, slot.view(x.shape, x.dtype))
    back = torch.empty_like(x)
    copier.wait(copier.to_device(slot.view(x.shape, x.dtype), back))
    torch.cuda.synchronize()
    assert torch.equal(back, x)
    HostSlots.release(slot)
    grown = pool.acquire(300 << 20)  # regrown: the old block is unregistered first, the new one registered
    assert grown is slot and grown.capacity == 304 << 20 and grown.data.is_pinned()  # 1/16 of 256 MiB steps


def test_head_normed_projections_recomputed_with_the_kernels_free_their_memory_and_train_the_same():
    """Qwen3-0.6B-shaped layers with Hone's kernels (the fused head norms save a view of the projection): after a
    recompute's forward, the q and k outputs are gone (T x (q + kv) x 2 bytes less allocated), each runs a third
    time in backward, and loss and LoRA gradients stay within the noise floor of keeping them."""
    from hone.core.speed.checkpointing.projection_recompute import recomputed_projections
    from hone.core.speed.fused.apply import apply_kernels

    torch.manual_seed(0)
    model = lora_model(with_run_attention(build_model("dense-0.6b", layers=2, dtype=torch.bfloat16, device="cuda")))
    apply_kernels(model, tile_mlp=True)
    config = model.get_base_model().config
    tokens = 8192
    layer = decoder_layers(model)[0]
    base = model.get_base_model().model
    hidden = torch.randn(1, tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(tokens, device="cuda")[None]
    kwargs = dict(position_embeddings=base.rotary_emb(hidden, positions), position_ids=positions, attention_mask=None)
    allocated = {}
    for enabled_from in (0, tokens):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16), recomputed_projections(layer, tokens, enabled_from):
            out = layer(hidden, **kwargs)
        allocated[enabled_from] = torch.cuda.memory_allocated() - before
        del out
    q_kv = (config.num_attention_heads + config.num_key_value_heads) * config.head_dim
    saved = allocated[0] - allocated[tokens]
    print(
        f"after a recompute's forward: {allocated[0] / 2**20:.0f} MiB kept, {allocated[tokens] / 2**20:.0f} with "
        f"recipes ({saved / 2**20:.0f} MiB less; q + k outputs {tokens * q_kv * 2 / 2**20:.0f} MiB)"
    )
    assert saved >= tokens * q_kv * 2

    batch = packed_batch([3000, 2500, 2692], vocab=config.vocab_size)
    ref_loss, ref, tolerance = reference(model, batch)
    checkpointer = apply_checkpointing(model, "offload", "cuda")
    checkpointer.projection_recompute_tokens = batch.num_tokens
    calls = [0]
    q_proj = decoder_layers(model)[0].self_attn.q_proj
    handle = q_proj.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    try:
        loss, grads = loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
    finally:
        handle.remove()
        revert_checkpointing(model)
    assert calls[0] == 3  # forward, recompute, and once more for the norm's backward
    error, where = worst_error(loss, grads, ref_loss, ref)
    assert error <= tolerance, f"relative error {error:.2e} in {where} (tolerance {tolerance:.2e})"


def test_layers_that_keep_their_activations_with_the_kernels_train_the_same_and_hold_what_the_planner_says():
    """speed.keep_layer_activations on Qwen3-0.6B-shaped layers with Hone's kernels: 2 of 4 layers kept train within
    the noise floor of no checkpointing, and the step's peak grows by about what the planner counts per kept layer
    (its figure is an upper bound: the fused kernels save less than every tensor it counts)."""
    from hone.core.memory.estimate import MemorySettings, estimate_peak
    from hone.core.memory.shape import ModelShape
    from hone.core.speed.fused.apply import apply_kernels

    torch.manual_seed(0)
    model = lora_model(with_run_attention(build_model("dense-0.6b", layers=4, dtype=torch.bfloat16, device="cuda")))
    apply_kernels(model, tile_mlp=True)
    config = model.get_base_model().config
    batch = packed_batch([3000, 2500, 2692], vocab=config.vocab_size)
    ref_loss, ref, tolerance = reference(model, batch)
    peaks = {}
    for kept in (0, 2):
        checkpointer = apply_checkpointing(model, "gpu", "cuda", kept_layers=kept)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        try:
            loss, grads = loss_and_grads(model, batch, autocast_dtype=torch.bfloat16)
        finally:
            revert_checkpointing(model)
        peaks[kept] = torch.cuda.max_memory_allocated() - before
        assert checkpointer.kept_layers == kept
        error, where = worst_error(loss, grads, ref_loss, ref)
        assert error <= tolerance, f"{kept} kept: relative error {error:.2e} in {where} (tolerance {tolerance:.2e})"
    shape = ModelShape.from_config(config)
    settings = MemorySettings(batch_tokens=batch.num_tokens, checkpoint="gpu", host_embeddings=False)
    planned = [estimate_peak(shape, dataclasses.replace(settings, kept_layers=k)).peak_bytes for k in (0, 2)]
    grown = peaks[2] - peaks[0]
    print(f"step peak {peaks[0] / 2**20:.0f} -> {peaks[2] / 2**20:.0f} MiB with 2 of 4 layers kept (planner: "
          f"+{(planned[1] - planned[0]) / 2**20:.0f} MiB)")  # fmt: skip
    assert 0 < grown <= planned[1] - planned[0]

"""The CUDA copy path of offloaded checkpoints, checked on the CPU.

`CudaCopier` runs on `StreamSim` (a stand-in for CUDA streams and the caching allocator with a race detector, see
stream_sim.py) through whole training steps: any copy that could race with the compute stream on a GPU is reported,
although the CPU runs everything in program order. Each ordering rule the copier follows is shown to matter: a
copier that breaks it is caught. Buffers and host slots are poisoned as soon as they are given back, device-side
layer inputs after forward, and the gradients stay exact; `verify` pinpoints a corrupted copy.
"""

from __future__ import annotations

import math
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
from hone.core.speed.checkpointing.offload_buffers import CudaCopier, HostSlots, SyncCopier
from tests.helpers.offload import ToyLayer, chain_grads, lora_model, loss_and_grads, packed_batch, toy_chain
from tests.helpers.stream_sim import StreamSim

MiB = 2**20


@pytest.fixture
def sim(monkeypatch):
    """A fresh StreamSim; host slots allocated meanwhile count as pinned host memory."""
    simulator = StreamSim()
    allocate = HostSlots._allocate

    def allocate_pinned(self, capacity):
        data, registered = allocate(self, capacity)
        return simulator.host(data), registered

    monkeypatch.setattr(HostSlots, "_allocate", allocate_pinned)
    return simulator


def exact(loss, grads, ref_loss, ref) -> bool:
    return torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))


# ---------------------------------------------------------------------------------------------------------------
# The simulator itself
# ---------------------------------------------------------------------------------------------------------------


def test_the_simulator_reports_unordered_accesses_and_accepts_ordered_ones():
    def scenario(wait_before_copy: bool, wait_before_read: bool, record: bool) -> list[str]:
        sim = StreamSim()
        side = sim.Stream()
        with sim.recording():
            src = sim.host(torch.ones(1000))
            side.wait_stream(sim.compute)  # src is written
            scratch = torch.zeros(1000) + 1  # compute work on memory that is freed and handed out again at once
            del scratch
            fresh = torch.empty(1000)
            if wait_before_copy:
                side.wait_stream(sim.compute)
            with sim.stream(side):
                fresh.copy_(src, non_blocking=True)
            done = sim.Event()
            done.record(side)
            if wait_before_read:
                sim.compute.wait_event(done)
            total = fresh.sum()
            produced = torch.full((500,), 2.0)
            side.wait_stream(sim.compute)
            with sim.stream(side):
                src[:500].copy_(produced, non_blocking=True)
            if record:
                sim.record_stream(produced, side)
            del produced
            float(total)  # the host waits for the compute stream: later work comes after
        return sim.races

    assert scenario(True, True, True) == []
    [race] = scenario(False, True, True)
    assert "side stream 1 writes" in race and "(from aten.empty" in race and "compute stream" in race, race
    [race] = scenario(True, False, True)
    assert "compute stream reads" in race and "aten.copy_" in race, race
    [race] = scenario(True, True, False)
    assert "freed without record_stream" in race, race


# ---------------------------------------------------------------------------------------------------------------
# The copy path through training steps
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "limit"), [("offload", None), ("offload-double", None), ("offload-double", 6 * MiB)])
def test_no_copy_races_through_steps_that_regrow_buffers_and_fall_back(sim, mode, limit):
    """Three steps of two micro-batches; the inputs outgrow the first 2 MiB buffers in step 2 (with a 6 MiB limit
    two 4 MiB buffers do not fit: offload-double falls back to one buffer in the middle of a backward pass)."""
    layers = toy_chain(3, width=256)
    checkpointer = Checkpointer(mode, "cpu", max_buffer_bytes=limit, streams=sim)
    steps = [(64, 300), (2100, 200), (900, 1500)]  # tokens; 2100 x 256 fp32 = 2.05 MiB
    for step, micro_batches in enumerate(steps):
        for tokens in micro_batches:
            x = torch.randn(1, tokens, 256, generator=torch.Generator().manual_seed(step * 10 + tokens))
            ref = chain_grads(layers, x)
            with sim.recording():
                got = chain_grads(layers, x, checkpointer)
            assert exact(*got, *ref), f"step {step}, {tokens} tokens: gradients differ"
        checkpointer.read_and_reset()
    assert sim.races == [], "\n".join(sim.races)
    assert sim.copies_on_side == 2 * len(layers) * sum(len(m) for m in steps), "every copy runs on the side stream"
    in_effect = "offload" if limit else mode
    assert checkpointer.mode == in_effect, checkpointer.notes
    assert [b.capacity for b in checkpointer.buffers] == [4 * MiB] * (2 if in_effect == "offload-double" else 1)


def _poison_on_release(monkeypatch):
    """Fill every reload buffer and host slot with NaN bytes the moment the checkpointer gives it back."""
    release = Checkpointer.release

    def poisoning(self, saved):
        buffer, slot = saved.buffer, saved.slot
        release(self, saved)
        if buffer is not None and buffer.data is not None and not buffer.reading:
            buffer.data.fill_(255)
        if slot is not None:
            slot.data.fill_(255)

    monkeypatch.setattr(Checkpointer, "release", poisoning)


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-moe-qwen3"])
def test_a_real_model_through_the_copy_path(sim, monkeypatch, shape):
    """Packed attention reading cu_seq_lens from the kwargs, rotary embeddings, LoRA dropout (llama) or MoE
    experts: two steps in offload-double with the simulator, `verify` and poisoning on; no race, every reloaded
    input byte-identical to the saved one, gradients exact."""
    base = build_model(shape, layers=2)
    assert attention.configure(base, SpeedConfig(attention="sdpa"), "cpu").name == "sdpa"
    model = lora_model(base, dropout=0.0 if "moe" in shape else 0.1)
    batches = [packed_batch([23, 41, 9]), packed_batch([30, 12], seed=1)]
    refs = [loss_and_grads(model, b) for b in batches]
    _poison_on_release(monkeypatch)
    checkpointer = apply_checkpointing(model, "offload-double", "cpu", streams=sim, verify=True)
    try:
        for batch, (ref_loss, ref) in zip(batches, refs, strict=True):
            with sim.recording():
                loss, grads = loss_and_grads(model, batch)
            assert torch.equal(loss, ref_loss)
            for name, expected in ref.items():
                assert torch.equal(grads[name], expected), f"gradient of {name} differs"
    finally:
        revert_checkpointing(model)
    assert sim.races == [], "\n".join(sim.races)
    layers = len(decoder_layers(model))
    assert sim.copies_on_side == 2 * layers * len(batches)
    stages = {"pinned host copy", "reload buffer", "reload buffer after backward"}
    assert {c.where for c in checkpointer.integrity} == stages
    assert len(checkpointer.integrity) == len(stages) * layers * len(batches)
    assert [c for c in checkpointer.integrity if c.differing_bytes] == []
    assert {c.layer for c in checkpointer.integrity} == {f"model.layers.{i}" for i in range(layers)}


# ---------------------------------------------------------------------------------------------------------------
# Every rule matters: a copier that breaks one is caught
# ---------------------------------------------------------------------------------------------------------------


class ReloadWithoutWaiting(CudaCopier):
    """What the first H200 run had for a new buffer: a reload that does not wait for the compute stream."""

    def to_device(self, src, dst):
        with self.streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        ready = self._timing_event()
        ready.record(self.stream)
        return ready


class OffloadWithoutWaiting(CudaCopier):
    def to_host(self, src, dst):
        with self.streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        self.streams.record_stream(src, self.stream)


class OffloadWithoutRecordStream(CudaCopier):
    def to_host(self, src, dst):
        self.stream.wait_stream(self.streams.current_stream(self.device))
        with self.streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)


class RecomputeWithoutWaiting(CudaCopier):
    def wait(self, ready):
        pass


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (
            ReloadWithoutWaiting,
            "aten.copy_ #{} on side stream 2 writes a 2.0 MiB storage (from aten.empty #{}) that was "
            "just allocated by aten.empty #{} on the compute stream",
        ),
        (OffloadWithoutWaiting, "aten.copy_ #{} on side stream 2 reads"),
        (OffloadWithoutRecordStream, "freed without record_stream"),
        (RecomputeWithoutWaiting, "on compute stream reads a 2.0 MiB storage (from aten.empty"),
    ],
)
@pytest.mark.parametrize("mode", ["offload", "offload-double"])
def test_a_copier_breaking_an_ordering_rule_is_caught(sim, mode, broken, expected):
    layers, x = toy_chain(3), torch.randn(1, 40, 256)
    ref = chain_grads(layers, x)
    checkpointer = Checkpointer(mode, "cpu", streams=sim)
    checkpointer.copier = broken(checkpointer.device, sim)  # its stream is the simulator's second side stream
    for _step in range(2):
        with sim.recording():
            got = chain_grads(layers, x, checkpointer)
        assert exact(*got, *ref)  # the CPU runs in program order: only the simulator can see the race
    pattern = re.escape(expected).replace(re.escape("#{}"), "#[0-9]+")
    assert any(re.search(pattern, race) for race in sim.races), "\n".join(sim.races) or "no race reported"
    if broken is ReloadWithoutWaiting:  # also a buffer refilled while the last recompute may still read it
        assert any(
            re.search(r"side stream 2 writes .* that aten\.\w+ #\d+ on compute stream uses", race) for race in sim.races
        ), "\n".join(sim.races)


# ---------------------------------------------------------------------------------------------------------------
# Poisoning and verify, with synchronous copies
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["gpu", "offload", "offload-double"])
def test_nothing_reads_a_buffer_slot_or_device_input_after_giving_it_up(monkeypatch, mode):
    """Reload buffers and host slots are NaN-filled as soon as they are given back; in the offload modes every layer
    input left on the device is NaN-filled after forward too (backward must read them from host memory only).
    gpu mode keeps those inputs, so there the poisoned inputs must show: the check has teeth."""
    layers, x = toy_chain(4), torch.randn(1, 50, 256)
    ref = chain_grads(layers, x)
    _poison_on_release(monkeypatch)

    def poison_inputs(inputs):
        with torch.no_grad():
            for h in inputs:
                h.fill_(math.nan)

    for step in range(2):
        got = chain_grads(layers, x.clone(), Checkpointer(mode, "cpu"), after_forward=poison_inputs)
        if mode == "gpu":
            assert all(g.isnan().any() for g in got[1]), "gpu mode recomputes from the inputs it kept on the device"
        else:
            assert exact(*got, *ref), f"{mode}, step {step}: a poisoned buffer, slot or device input was read"


class CorruptingCopier(SyncCopier):
    """Synchronous copies, with the first `bad` bytes of every copy to `target` ("host" or "device") zeroed."""

    def __init__(self, target: str, bad: int = 64):
        super().__init__()
        self.target, self.bad = target, bad

    def _corrupt(self, dst):
        dst.view(-1).view(torch.uint8)[: self.bad].zero_()

    def to_host(self, src, dst):
        super().to_host(src, dst)
        if self.target == "host":
            self._corrupt(dst)

    def to_device(self, src, dst):
        super().to_device(src, dst)
        if self.target == "device":
            self._corrupt(dst)
        return None


@pytest.mark.parametrize("target", ["host", "device"])
def test_verify_says_which_copy_went_wrong_for_which_layer(target):
    layers, x = toy_chain(3), torch.randn(1, 40, 256) + 5  # no input value is all zero bytes
    for i, layer in enumerate(layers):
        layer.name = f"layers.{i}"
    checkpointer = Checkpointer("offload", "cpu", verify=True)
    checkpointer.layer_names = {id(layer): layer.name for layer in layers}
    checkpointer.copier = CorruptingCopier(target)
    chain_grads(layers, x, checkpointer)
    bad = {(c.layer, c.where) for c in checkpointer.integrity if c.differing_bytes}
    names = {layer.name for layer in layers}
    if target == "host":
        assert bad >= {(n, w) for n in names for w in ("pinned host copy", "reload buffer")}, bad
    else:
        assert bad >= {(n, "reload buffer") for n in names} and not any(w == "pinned host copy" for _, w in bad), bad
    assert all(0 < c.differing_bytes <= 64 for c in checkpointer.integrity if c.differing_bytes)


# ---------------------------------------------------------------------------------------------------------------
# Guards
# ---------------------------------------------------------------------------------------------------------------


class InPlaceLayer(ToyLayer):
    def forward(self, h, scale=None):
        return h.add_(torch.tanh(self.linear(h)))


def test_a_layer_that_writes_into_its_input_is_refused_with_its_name():
    layer = InPlaceLayer(64, 0)
    checkpointer = Checkpointer("offload", "cpu")
    checkpointer.layer_names = {id(layer): "model.layers.7"}
    h = torch.randn(1, 5, 64, requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match=r"model\.layers\.7 wrote into its input in place"):
        checkpointer(layer, h)


class Outer(torch.nn.Module):
    """A checkpointed block that calls the checkpoint function for a sub-block (nested checkpointed layers)."""

    def __init__(self, checkpointer, seed):
        super().__init__()
        self.checkpointer, self.inner, self.outer = checkpointer, ToyLayer(256, seed), ToyLayer(256, seed + 100)

    def forward(self, h, scale=None):
        return self.outer(self.checkpointer(self.inner, h))


@pytest.mark.parametrize("mode", ["offload", "offload-double"])
def test_nested_checkpointed_layers_run_plainly_inside_a_recompute(mode):
    checkpointer = Checkpointer(mode, "cpu")
    blocks, x = [Outer(checkpointer, seed) for seed in range(3)], torch.randn(1, 30, 256)
    ref = chain_grads(blocks, x, Checkpointer("gpu", "cpu"))
    got = chain_grads(blocks, x, checkpointer)
    assert exact(*got, *ref)
    assert checkpointer.copier.counters.offload_bytes == 3 * 30 * 256 * 4, "only the outer blocks' inputs are saved"
    assert not any(b.reading for b in checkpointer.buffers)

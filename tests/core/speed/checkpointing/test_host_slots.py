"""Pinned host slots for offloaded layer inputs: large slots are plain memory registered with CUDA at (nearly) the
size asked, unregistered before they are freed; registration that fails falls back to torch's pinned allocator;
the pool stops at its byte budget and a Checkpointer keeps the inputs past it on the device. The CUDA calls go
through a stand-in here; tests/core/speed/checkpointing/test_checkpointer_gpu.py runs the real ones."""

from __future__ import annotations

import gc

import torch

from hone.core.machine.pinned_memory import REGISTERED_MIN_BYTES, offload_budget, pinned_slot_bytes
from hone.core.speed.checkpointing.checkpointer import Checkpointer
from hone.core.speed.checkpointing.offload_buffers import HostSlots
from tests.helpers.offload import chain_grads, toy_chain

MiB, GiB = 2**20, 2**30


class StandInCudart:
    """Records cudaHostRegister / cudaHostUnregister calls and what was registered; `fail` makes registering
    return a CUDA error code."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.registered: dict[int, int] = {}
        self.calls: list[tuple] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size))
        if self.fail:
            return 2  # cudaErrorMemoryAllocation
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr))
        assert ptr in self.registered, "unregistering memory that was never registered"
        del self.registered[ptr]
        return 0


def test_slot_sizes_are_within_a_sixteenth_of_the_input_above_the_registered_minimum():
    assert pinned_slot_bytes(1) == MiB and pinned_slot_bytes(REGISTERED_MIN_BYTES) == REGISTERED_MIN_BYTES
    assert pinned_slot_bytes(40 * MiB) == 64 * MiB  # small: torch's power-of-two blocks
    row_409600 = 409_600 * 4096 * 2  # Qwen3-8B's layer input at 409,600 tokens: 3.125 GiB
    assert pinned_slot_bytes(row_409600) == row_409600  # torch's allocator would pin 4 GiB
    for nbytes in (65 * MiB, 100 * MiB + 1, int(3.1 * GiB), 7 * GiB + 5):
        slot = pinned_slot_bytes(nbytes)
        assert nbytes <= slot <= nbytes * 17 / 16, nbytes
    assert offload_budget(100 * GiB) == int(85 * GiB) and offload_budget(-1) == 0


def test_large_slots_are_registered_unregistered_before_they_regrow_and_when_dropped():
    cudart, order = StandInCudart(), []
    pool = HostSlots(pin=False, register=True, cudart=cudart, synchronize=lambda: order.append("synchronize"))
    small = pool.acquire(MiB)
    assert cudart.calls == [] and small.capacity == MiB  # under the registered minimum: not registered
    big = pool.acquire(100 * MiB)
    assert big.capacity == 100 * MiB and cudart.registered == {big.data.data_ptr(): 100 * MiB}
    first = big.data.data_ptr()
    HostSlots.release(big)
    HostSlots.release(small)
    grown = pool.acquire(200 * MiB)  # regrows the largest free slot
    assert grown is big and grown.capacity == 200 * MiB
    assert ("unregister", first) in cudart.calls and order == ["synchronize"]  # waited for queued copies first
    assert cudart.registered == {grown.data.data_ptr(): 200 * MiB}
    view = grown.view(torch.Size([4, 8]), torch.bfloat16)
    view.fill_(1.5)
    assert grown.data[:64].view(torch.bfloat16).eq(1.5).all()
    del pool, small, big, grown, view
    gc.collect()
    assert cudart.registered == {}, "a dropped pool leaves no memory registered"


def test_a_failed_registration_falls_back_to_torchs_allocator_and_is_not_tried_again():
    cudart = StandInCudart(fail=True)
    pool = HostSlots(pin=False, register=True, cudart=cudart, synchronize=lambda: None)
    slot = pool.acquire(100 * MiB)
    assert not pool.register and "cudaHostRegister returned 2" in pool.register_error
    assert slot.capacity == 128 * MiB and slot.unpin is None  # a power-of-two block, nothing to unregister
    HostSlots.release(slot)
    pool.acquire(300 * MiB)
    assert [call[0] for call in cudart.calls] == ["register"]


def test_the_pool_stops_at_its_budget_and_reuses_what_it_holds():
    pool = HostSlots(pin=False, budget_bytes=3 * MiB)
    slots = [pool.acquire(MiB) for _ in range(3)]
    assert all(slot is not None for slot in slots) and pool.acquire(MiB) is None
    HostSlots.release(slots[0])
    assert pool.acquire(100) is slots[0]  # a held slot is always usable
    HostSlots.release(slots[1])
    assert pool.acquire(2 * MiB) is None  # regrowing it would pass the budget
    assert pool.total_bytes == 3 * MiB


def test_inputs_past_the_host_budget_stay_on_the_device_and_training_is_unchanged():
    layers = toy_chain(5, width=1024)
    x = torch.randn(1, 300, 1024, generator=torch.Generator().manual_seed(0))  # 1.2 MiB inputs: 2 MiB slots
    ref_loss, ref = chain_grads(layers, x)
    notes = []
    checkpointer = Checkpointer(
        "offload-double", "cpu", host_budget_bytes=4 * MiB, note=lambda *args: notes.append(args)
    )
    for _step in range(2):
        loss, grads = chain_grads(layers, x, checkpointer)
        assert torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref, strict=True))
        assert checkpointer.kept_over_budget == 3  # the first two layers' inputs went to the host
        metrics = checkpointer.read_and_reset()
        assert metrics["offload_bytes"] == 2 * 300 * 1024 * 4 and checkpointer.kept_over_budget == 0
    assert len(checkpointer.host.slots) == 2 and all(not s.in_use for s in checkpointer.host.slots)
    assert len(notes) == 1 and notes[0][0] == "checkpoint" and notes[0][2] == "info"
    assert "host memory budget for offloaded layer inputs (4 MiB) is reached" in notes[0][1]


def test_processes_on_one_host_share_its_budget():
    from hone.core.machine.pinned_memory import processes_on_this_host

    assert offload_budget(100 * GiB, processes=4) == int(85 * GiB) // 4
    assert processes_on_this_host({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert processes_on_this_host({}) == 1 and processes_on_this_host({"LOCAL_WORLD_SIZE": "x"}) == 1

"""Memory and copies for offloaded activation checkpoints: pinned host slots, GPU reload buffers, copy streams.

A saved layer input waits for its backward in a `HostSlot` (pinned host memory) and is copied back into a
`ReloadBuffer` on the GPU (one or two of them) for its layer's recompute; both are allocated once, grow with the
largest input seen and are reused across steps. Large host slots are ordinary allocations page-locked with
`cudaHostRegister`, sized to within 1/16 of the input: torch's pinned allocator rounds to powers of two, which at
long rows holds a third more page-locked memory than the inputs need. The slots stop growing at a byte budget (the
host's available memory): inputs past it stay on the GPU. On a GPU every copy runs on a side stream under the
ordering rules in `CudaCopier`'s docstring, which the tests check on the CPU with a stream simulator; `SyncCopier`
runs the same bookkeeping synchronously for a CPU device.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from hone.core.machine.pinned_memory import REGISTERED_MIN_BYTES, pinned_slot_bytes, torch_pinned_bytes

# The CUDA caching allocator hands out large blocks in 2 MiB pages; reload buffers are sized to whole pages.
DEVICE_BUFFER_GRANULE = 2 << 20


def reload_buffer_bytes(nbytes: int) -> int:
    """Capacity of a GPU reload buffer that holds `nbytes`: rounded up to whole 2 MiB pages."""
    return -(-int(nbytes) // DEVICE_BUFFER_GRANULE) * DEVICE_BUFFER_GRANULE


def _uninferenced():
    """Buffers must never be inference tensors (autograd refuses them later), whatever mode the caller is in."""
    return torch.inference_mode(False)


@dataclass(eq=False)
class HostSlot:
    """Pinned host memory for one saved layer input. `data` is a flat uint8 tensor of `capacity` bytes; `unpin`
    unregisters a registered slot's memory (called when the slot regrows or is dropped)."""

    data: torch.Tensor
    in_use: bool = False
    unpin: weakref.finalize | None = None

    @property
    def capacity(self) -> int:
        return self.data.numel()

    def view(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The first bytes of the slot seen as a contiguous tensor of `shape` and `dtype`."""
        nbytes = shape.numel() * dtype.itemsize
        return self.data[:nbytes].view(dtype).view(shape)


def _unregister(cudart, data: torch.Tensor, synchronize) -> None:
    """Give a registered block back to pageable memory, then (when the finalizer lets go of `data`) to the system.
    No copy may still be reading or writing it: the slot was released when its layer's backward was queued, not run."""
    try:
        synchronize()
        cudart.cudaHostUnregister(data.data_ptr())
    except Exception:  # the CUDA context may already be gone (process exit); the memory goes with it
        pass


class HostSlots:
    """A pool of pinned host slots: taken in forward, given back after the layer's backward, reused across steps.

    A slot taken for a bigger input than any free slot holds regrows one free slot (or adds a slot), so the pool
    ends up with as many slots as layer inputs wait at once (the number of decoder layers), each sized by the
    largest input seen.

    Args:
        pin: page-lock the slots (CUDA); False gives plain memory (a CPU device, tests).
        register: page-lock large slots with `cudaHostRegister` (default: when pinning); tests register plain memory
            through a stand-in `cudart`.
        budget_bytes: the most the slots may hold together; an input whose slot would pass it gets none
            (`acquire` returns None) and stays on the GPU. None: no limit.
        cudart: the CUDA runtime calls `cudaHostRegister` / `cudaHostUnregister` (torch.cuda.cudart() by default);
            tests pass a stand-in. Registration that fails once is not tried again: slots come from torch's pinned
            allocator.
        synchronize: waits for the GPU's queued work before a registered block is unregistered
            (torch.cuda.synchronize by default).
    """

    def __init__(
        self, pin: bool, *, budget_bytes: int | None = None, register: bool | None = None, cudart=None, synchronize=None
    ):
        self.pin = pin
        self.budget_bytes = budget_bytes
        self.register = pin if register is None else register
        self.register_error = ""
        self._cudart = cudart
        self._synchronize = synchronize
        self.slots: list[HostSlot] = []

    @property
    def total_bytes(self) -> int:
        return sum(slot.capacity for slot in self.slots)

    def slot_bytes(self, nbytes: int) -> int:
        """The capacity a slot for `nbytes` gets."""
        return pinned_slot_bytes(nbytes) if self.register else torch_pinned_bytes(nbytes)

    def _allocate(self, capacity: int) -> tuple[torch.Tensor, bool]:
        """A flat uint8 block of (at least) `capacity` bytes, and whether it is registered (else from torch's
        allocator, pinned or plain)."""
        with _uninferenced():
            if self.register and capacity > REGISTERED_MIN_BYTES:
                # Touched first, on every CPU thread: registering then only locks pages that exist (the driver
                # faults in missing pages one thread at a time).
                data = torch.zeros(capacity, dtype=torch.uint8)
                if self._register(data):
                    return data, True
            # torch's pinned allocator holds a power of two whatever is asked: count that
            return torch.empty(torch_pinned_bytes(capacity), dtype=torch.uint8, pin_memory=self.pin), False

    def _fill(self, slot: HostSlot | None, capacity: int) -> HostSlot:
        """`slot` (regrown) or a new slot, holding `capacity` fresh bytes."""
        if slot is not None and slot.unpin is not None:
            slot.unpin()  # the old block is unregistered before it is freed
        data, registered = self._allocate(capacity)
        if slot is None:
            slot = HostSlot(data)
        else:
            slot.data, slot.unpin = data, None
        if registered:
            slot.unpin = weakref.finalize(slot, _unregister, self._cudart, data, self._synchronize)
            slot.unpin.atexit = False  # at exit the memory goes with the process
        return slot

    def _register(self, data: torch.Tensor) -> bool:
        """Page-lock `data` in place; on failure, keep why and use torch's pinned allocator from then on."""
        try:
            if self._cudart is None:
                self._cudart = torch.cuda.cudart()
            if self._synchronize is None:
                self._synchronize = torch.cuda.synchronize
            error = self._cudart.cudaHostRegister(data.data_ptr(), data.numel(), 0)
            if int(error) == 0:
                return True
            self.register_error = f"cudaHostRegister returned {error}"
        except (AttributeError, TypeError, RuntimeError, AssertionError) as e:  # a build without these calls
            self.register_error = f"cudaHostRegister is not available ({e})"
        self.register = False
        return False

    def acquire(self, nbytes: int) -> HostSlot | None:
        """A free slot with room for `nbytes`, or None when growing the pool for it would pass the budget.

        Raises:
            RuntimeError: pinned host memory could not be allocated (the caller keeps the input on the GPU).
        """
        free = [slot for slot in self.slots if not slot.in_use]
        fitting = [slot for slot in free if slot.capacity >= nbytes]
        if fitting:
            slot = min(fitting, key=lambda s: s.capacity)
        else:
            # regrow the largest free slot (the others stay small for smaller inputs), or add one
            grown = max(free, key=lambda s: s.capacity) if free else None
            capacity = self.slot_bytes(nbytes)
            total = self.total_bytes + capacity - (grown.capacity if grown is not None else 0)
            if self.budget_bytes is not None and total > self.budget_bytes:
                return None
            slot = self._fill(grown, capacity)
            if grown is None:
                self.slots.append(slot)
        slot.in_use = True
        return slot

    @staticmethod
    def release(slot: HostSlot) -> None:
        slot.in_use = False


@dataclass(eq=False)
class ReloadBuffer:
    """A GPU buffer one saved input is copied back into for its layer's recompute.

    Attributes:
        data: flat uint8 tensor on the compute device, or None once the buffer is given up.
        owner: sequence number of the saved input it holds (or is being filled with); -1 when none.
        reading: True from the moment a layer's recompute is handed a view of it until that layer's backward is
            queued: no copy may be issued into it meanwhile.
    """

    data: torch.Tensor | None
    owner: int = -1
    reading: bool = False

    @property
    def capacity(self) -> int:
        return 0 if self.data is None else self.data.numel()

    def view(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = shape.numel() * dtype.itemsize
        return self.data[:nbytes].view(dtype).view(shape)


def allocate_reload_buffer(device: torch.device, nbytes: int, copier: Copier) -> torch.Tensor:
    """A flat uint8 GPU tensor of `reload_buffer_bytes(nbytes)` bytes, made safe to use on the copy stream.

    Raises:
        torch.OutOfMemoryError: the device has no room for it.
    """
    with _uninferenced():
        data = torch.empty(reload_buffer_bytes(nbytes), dtype=torch.uint8, device=device)
    copier.adopt(data)
    return data


def size_text(nbytes: int) -> str:
    """Bytes for people: "1.25 GiB", or "96 MiB" under a GiB."""
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def second_buffer_decision(
    buffer_bytes: int, held_bytes: int, limit_bytes: int | None, headroom_bytes: int | None, margin_bytes: int
) -> str | None:
    """Whether a second reload buffer of `buffer_bytes` may be allocated, or why not.

    Args:
        buffer_bytes: capacity the second buffer needs.
        held_bytes: capacity the other reload buffer already holds.
        limit_bytes: the most device memory the reload buffers may hold together (None = no limit).
        headroom_bytes: device memory still available to this process (None = unknown, e.g. a CPU device).
        margin_bytes: memory that must stay free after the allocation.

    Returns:
        None when it may be allocated, else the reason in words.
    """
    if limit_bytes is not None and held_bytes + buffer_bytes > limit_bytes:
        return (
            f"two reload buffers need {size_text(held_bytes + buffer_bytes)}, over the {size_text(limit_bytes)} allowed"
        )
    if headroom_bytes is not None and headroom_bytes - buffer_bytes < margin_bytes:
        return (
            f"only {size_text(headroom_bytes)} of GPU memory is free and a second buffer needs "
            f"{size_text(buffer_bytes)} plus {size_text(margin_bytes)} kept free"
        )
    return None


def tight_memory_reason(
    free_bytes: int, reserved_bytes: int, peak_allocated_bytes: int, margin_bytes: int
) -> str | None:
    """Why memory counts as tight after a step (less than `margin_bytes` was left at its peak), or None.

    Args:
        free_bytes: device memory no process holds now (driver view).
        reserved_bytes: memory this process's allocator holds now.
        peak_allocated_bytes: the most this process had allocated at once during the step.
        margin_bytes: what should have stayed free.
    """
    left = free_bytes + reserved_bytes - peak_allocated_bytes
    if left >= margin_bytes:
        return None
    return (
        f"memory got tight: only {size_text(left)} was free at the last step's peak (under {size_text(margin_bytes)})"
    )


@dataclass
class StepCounters:
    """What the copies did since the last read: bytes sent to the host and (start, ready) pairs of timed waits."""

    offload_bytes: int = 0
    waits: list[tuple[object, object]] = field(default_factory=list)


class SyncCopier:
    """Copies on a CPU device: synchronous, no streams, no events, no stalls to time."""

    def __init__(self):
        self.counters = StepCounters()

    def adopt(self, buffer: torch.Tensor) -> None:
        pass

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        dst.copy_(src)
        self.counters.offload_bytes += dst.numel() * dst.element_size()

    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> object | None:
        dst.copy_(src)
        return None

    def wait(self, ready: object | None) -> None:
        pass

    def read_stall_s(self) -> float:
        return 0.0


class TorchCudaStreams:
    """The CUDA stream API `CudaCopier` uses: torch.cuda's, with `record_stream` as a function. Tests hand the copier
    a stand-in with the same calls that checks their ordering on the CPU."""

    Stream = staticmethod(torch.cuda.Stream)
    Event = staticmethod(torch.cuda.Event)
    current_stream = staticmethod(torch.cuda.current_stream)
    stream = staticmethod(torch.cuda.stream)

    @staticmethod
    def record_stream(tensor: torch.Tensor, stream) -> None:
        tensor.record_stream(stream)


class CudaCopier:
    """Copies between the GPU and pinned host memory on a side stream, ordered against the compute stream.

    The rules, each one needed (the GPU runs work of two streams in any order that nothing forbids):
    - Every copy first makes the side stream wait for all work the compute stream has queued so far. For `to_host`
      that work produces the layer input. For `to_device` it covers two things: the last recompute that read the
      target buffer (it was queued before the buffer was handed out again), and, for a buffer just allocated or
      grown, whatever compute work still uses that memory: the caching allocator hands a block freed on the compute
      stream to the next allocation at once, while kernels queued before may still be writing it, and a copy on
      another stream that does not wait for them is overwritten by them afterwards.
    - `to_host` tells the allocator (`record_stream`) that the side stream reads the input, so its memory is not
      handed out again before the copy has run; reload buffers are marked the same way when allocated.
    - The recompute reads a reload buffer only after `wait(ready)`: the compute stream waits for that copy's event.
      Copies go into pinned host memory, so non_blocking copies never read or write pageable memory.
    `wait` also records when the compute stream got there, so the copy stall is `max(0, ready - start)`, read after
    the step's own synchronization without another one.

    Args:
        device: the compute device.
        streams: the stream API (`TorchCudaStreams()` by default); the tests pass a CPU simulator of it.
    """

    def __init__(self, device: torch.device, streams=None):
        self.device = device
        self.streams = streams if streams is not None else TorchCudaStreams()
        self.stream = self.streams.Stream(device)
        self.counters = StepCounters()
        self._spare_events: list[object] = []

    def _timing_event(self):
        return self._spare_events.pop() if self._spare_events else self.streams.Event(enable_timing=True)

    def adopt(self, buffer: torch.Tensor) -> None:
        # The allocator then waits for this stream's pending copies before it hands the memory out again.
        self.streams.record_stream(buffer, self.stream)

    def to_host(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        compute = self.streams.current_stream(self.device)
        self.stream.wait_stream(compute)
        with self.streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        self.streams.record_stream(src, self.stream)
        self.counters.offload_bytes += dst.numel() * dst.element_size()

    def to_device(self, src: torch.Tensor, dst: torch.Tensor) -> object:
        self.stream.wait_stream(self.streams.current_stream(self.device))
        with self.streams.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        ready = self._timing_event()
        ready.record(self.stream)
        return ready

    def wait(self, ready: object | None) -> None:
        if ready is None:
            return
        compute = self.streams.current_stream(self.device)
        start = self._timing_event()
        start.record(compute)
        compute.wait_event(ready)
        self.counters.waits.append((start, ready))

    def read_stall_s(self) -> float:
        """Seconds the compute stream waited for reloads since the last read; the events are then reused."""
        total_ms = 0.0
        for start, ready in self.counters.waits:
            if not ready.query():  # only when called before the step synchronized; the trainer never does
                ready.synchronize()
            if not start.query():
                start.synchronize()
            total_ms += max(0.0, start.elapsed_time(ready))
            self._spare_events.extend((start, ready))
        self.counters.waits.clear()
        return total_ms / 1000.0


Copier = SyncCopier | CudaCopier

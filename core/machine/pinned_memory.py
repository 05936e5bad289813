"""Page-locked host memory for offloaded layer inputs: the size of the slot one input takes, and how much of the
host's memory the slots may hold. Shared by the checkpointer that allocates the slots and the memory planner that
predicts them; stdlib only."""

from __future__ import annotations

# torch's pinned host allocator rounds every request up to a power of two (at least 1 MiB) and caches blocks by that
# size: a layer input of 3.1 GiB would hold 4 GiB of page-locked memory.
TORCH_PINNED_MIN_BYTES = 1 << 20
# Larger slots are ordinary allocations page-locked in place (cudaHostRegister). A smaller allocation may come from
# the C heap and share a page with other data, which CUDA would then pin too (glibc maps requests over 32 MiB).
REGISTERED_MIN_BYTES = 64 << 20
# A registered slot's size classes: 16 per doubling, so a slot holds at most 1/16 more than the input needing it and
# an input a little larger than the last one rarely re-registers a slot.
REGISTERED_CLASSES_PER_DOUBLING = 16
# The share of the host's available memory that offloaded inputs may take: the rest stays for the process's own
# growth, the data loader and everything else running (the planner keeps the same share free: memory/fit.py).
HOST_HEADROOM = 0.15


def torch_pinned_bytes(nbytes: int) -> int:
    """A block of torch's pinned allocator that holds `nbytes`: the next power of two, at least 1 MiB."""
    return max(TORCH_PINNED_MIN_BYTES, 1 << max(0, int(nbytes) - 1).bit_length())


def pinned_slot_bytes(nbytes: int) -> int:
    """A host slot that holds `nbytes`: registered memory rounded up to its size class, or under
    REGISTERED_MIN_BYTES a block of torch's pinned allocator."""
    nbytes = int(nbytes)
    if nbytes <= REGISTERED_MIN_BYTES:
        return torch_pinned_bytes(nbytes)
    step = (1 << (nbytes.bit_length() - 1)) // REGISTERED_CLASSES_PER_DOUBLING
    return -(-nbytes // step) * step


def offload_budget(available_bytes: float, processes: int = 1) -> int:
    """Bytes of host slots one process may hold, given the system memory available before anything is offloaded
    and the training processes on this host that share it (one per GPU)."""
    return int(max(0.0, available_bytes) * (1 - HOST_HEADROOM)) // max(1, processes)


def processes_on_this_host(environ=None) -> int:
    """Training processes started on this host together: torchrun's LOCAL_WORLD_SIZE, else one."""
    import os

    value = (os.environ if environ is None else environ).get("LOCAL_WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def available_system_memory() -> int:
    """System memory the kernel could hand out now without swapping (0 when unknown)."""
    from hone.core.machine.telemetry import system_memory

    used, total = system_memory()
    return max(0, total - used)

"""One run trained by several processes together, one per GPU, as `torchrun` starts them (NCCL on GPUs, gloo on
the CPU): data parallel over the trainable weights.

Every process holds the whole model and the whole dataset. Each optimizer step's packs are dealt out in turn
(process r takes packs r, r + N, ...), each process runs forward and backward on its own, the gradients are summed
across processes and every process applies the same update. The loss is normalized by the trained tokens of the
whole step, which every process knows from the row lengths, so a step equals the single-process step with the
same packs. Process 0 alone writes the run folder, checkpoints, the adapter and the events.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.events import Notice

# A process that stops answering (not one that exits: torchrun and the transport notice that at once) brings
# the others down after this long, with an error instead of a hang. Rank 0 tokenizing a large dataset while the
# others wait is the longest wait a healthy run has.
TIMEOUT = timedelta(minutes=30)


PEER_ADVICE = (
    "the other processes' messages say which one failed and why; the run goes on from its last "
    "checkpoint with `hone train --resume RUN_DIR`"
)


class PeerLost(HoneError):
    """An exchange between the processes failed: another process ended (or stopped answering for TIMEOUT)."""


@contextlib.contextmanager
def _exchange(what: str):
    """Turn a failed collective into one message saying what happened (gloo and NCCL raise RuntimeErrors whose
    text names their source files)."""
    try:
        yield
    except HoneError:
        raise
    except (RuntimeError, dist.DistError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PeerLost(
            f"another process of this run stopped or stopped answering while {what} ({first[:200]})", PEER_ADVICE
        ) from e


@dataclass(frozen=True)
class World:
    """This process's place among the run's processes (`local_*`: on this machine). `launched` is true under
    torchrun, even with one process (the collectives then run, with nothing to exchange)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    launched: bool = False
    local_size: int = 1  # processes on this machine

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, packs: list) -> list:
        """This process's packs of a step: every size-th, starting at its rank."""
        return packs[self.rank :: self.size] if self.launched else packs


SINGLE = World()


def from_environment(env=os.environ) -> World:
    """The world torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK), or one plain process."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return SINGLE
    try:
        rank, size, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
        local_size = int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    except ValueError:
        raise HoneError(
            f"RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} in the environment are not numbers",
            "start several processes with `hone train --gpus N` or torchrun",
        ) from None
    if not 0 <= rank < size:
        raise HoneError(f"RANK={rank} is outside WORLD_SIZE={size}", "start the processes with torchrun")
    return World(rank, size, local, launched=True, local_size=local_size)


def join(world: World) -> str:
    """Join the run's process group; the device this process trains on (its own GPU, or the CPU)."""
    if not world.launched:
        raise ValueError("join() is for processes torchrun started")
    if torch.cuda.is_available():
        if world.local_rank >= torch.cuda.device_count():
            raise HoneError(
                f"process {world.rank} was given GPU {world.local_rank}, but this machine shows "
                f"{torch.cuda.device_count()}",
                "start at most one process per GPU (--gpus N)",
            )
        torch.cuda.set_device(world.local_rank)
        device, backend = f"cuda:{world.local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=TIMEOUT)
    return device


def finish_together(world: World) -> None:
    """Wait until every process has finished the run (process 0 saves the adapter meanwhile), so none tears down
    the process group while another still uses it: under gloo a process that did so sometimes aborted at exit
    ("terminate called without an active exception")."""
    if world.launched:
        with _exchange("finishing the run"):
            dist.barrier()


def leave() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _reduce_device(world: World) -> torch.device:
    """Where small collective tensors live: NCCL exchanges GPU memory only."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def sum_values(values: list[float], world: World) -> list[float]:
    """Each value summed over the processes (float64, so token counts and loss sums stay exact)."""
    if not world.launched:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_reduce_device(world))
    with _exchange("summing the evaluation"):
        dist.all_reduce(t)
    return t.tolist()


def any_process(flag: bool, world: World) -> bool:
    """True on every process when it is true on one (a stop asked for in one terminal stops them all, at the same
    step)."""
    if not world.launched:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_reduce_device(world))
    with _exchange("agreeing on the next step"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def most(value: int, world: World) -> int:
    """The largest of every process's `value` (how many passes a sharded step must run on each)."""
    if not world.launched:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_reduce_device(world))
    with _exchange("agreeing on the passes of a step"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather(value, world: World) -> list:
    """Every process's `value` (any picklable object), in rank order, on every process."""
    if not world.launched:
        return [value]
    out = [None] * world.size
    with _exchange("gathering the random states for a checkpoint"):
        dist.all_gather_object(out, value)
    return out


def from_main(value, world: World):
    """Process 0's `value` on every process."""
    if not world.launched:
        return value
    box = [value]
    with _exchange("receiving the run folder from process 0"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def shared_memory(memory, device: str, world: World):
    """The memory each process may plan a step with (a hone.core.memory.run_plan.Memory): its own GPU's free
    memory, or its share of the system's on the CPU; the least of them on every process, so all plan alike."""
    from hone.core.memory.run_plan import MEMORY_ENV

    if os.environ.get(MEMORY_ENV, "").strip():
        pass  # a cap the user set holds for each process
    elif device.startswith("cuda") and memory.gpu and not memory.unified:
        free = torch.cuda.mem_get_info()[0]
        memory = dataclasses.replace(memory, available=float(free), device=torch.cuda.get_device_name())
    else:  # the processes of this machine draw on one pool (system memory, or a unified-memory GPU's)
        memory = dataclasses.replace(
            memory,
            available=memory.available / world.local_size,
            device=f"{memory.device}, shared by {world.local_size} processes",
        )
    t = torch.tensor([memory.available], dtype=torch.float64, device=_reduce_device(world))
    with _exchange("comparing free memory"):
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return dataclasses.replace(memory, available=float(t.item()))


def gather_counts(value: int, world: World) -> list[int]:
    """Every process's integer (its GPU's peak memory), in rank order."""
    if not world.launched:
        return [value]
    t = torch.tensor([value], dtype=torch.int64, device=_reduce_device(world))
    out = [torch.empty_like(t) for _ in range(world.size)]
    with _exchange("gathering the memory of each GPU"):
        dist.all_gather(out, t)
    return [int(x.item()) for x in out]


def sum_tensor_(tensor: torch.Tensor, world: World) -> None:
    """Sum a tensor in place over the processes (the step's loss sum, left on the device)."""
    if world.launched:
        _all_reduce(tensor, world)


@contextlib.contextmanager
def main_first(world: World):
    """Process 0 runs the block first (it fills the caches: tokenized data, a converted GGUF), then the others
    (they read them back)."""
    if world.launched and not world.main:
        with _exchange("waiting for process 0 to load the data"):
            dist.barrier()
    yield
    if world.launched and world.main:
        with _exchange("waiting for the other processes"):
            dist.barrier()


def same_start(params: list[torch.Tensor], world: World) -> None:
    """Every process starts from process 0's trainable weights. They are seeded alike already; this makes it
    so whatever consumed random numbers before."""
    if not world.launched:
        return
    with torch.no_grad(), _exchange("receiving the starting weights"):
        for p in params:
            dist.broadcast(p.data, src=0)


def sum_gradients(params: list[torch.Tensor], optimizer, world: World) -> None:
    """Sum the step's gradients over the processes, in one exchange per dtype.

    A parameter that got no gradient here (no token reached it) takes part as zeros, so every process exchanges
    the same buffers. gloo sums 16-bit values in float32 (it has no bfloat16 sum everywhere)."""
    if not world.launched:
        return
    flat = getattr(optimizer, "flat_grads", None)  # FlatAdamW folds every gradient into one buffer
    if flat is not None:
        _all_reduce(flat, world)
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        grads = [p.grad for p in group]
        buffer = torch.cat([g.reshape(-1) for g in grads])
        _all_reduce(buffer, world)
        offset = 0
        for g in grads:
            g.copy_(buffer[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _all_reduce(tensor: torch.Tensor, world: World) -> None:
    with _exchange("summing the step's gradients"):
        if dist.get_backend() == "gloo" and tensor.dtype in (torch.bfloat16, torch.float16):
            wide = tensor.float()
            dist.all_reduce(wide)
            tensor.copy_(wide)
        else:
            dist.all_reduce(tensor)


def share_step(config: RunConfig, world: World) -> tuple[RunConfig, Notice | None]:
    """A new run's step dealt out to the processes: each micro-batch holds batch_tokens / N tokens and a step
    takes N × grad_accum of them, N × grad_accum / N per process. A step trains the tokens the config asks for,
    whatever N is; the config the run records says batch_tokens and grad_accum as they run, so a resume on
    another number of processes trains the same packs per step."""
    if not world.launched or world.size == 1:
        return config, None
    t = config.train
    budget = t.batch_tokens // world.size
    if config.speed.packing and budget < config.data.max_length:
        raise HoneError(
            f"with {world.size} processes each micro-batch holds train.batch_tokens / {world.size} = "
            f"{budget} tokens, less than data.max_length ({config.data.max_length})",
            f"raise train.batch_tokens to at least {world.size * config.data.max_length}, or lower "
            f"data.max_length to at most {budget}",
        )
    shared = dataclasses.replace(
        config, train=dataclasses.replace(t, batch_tokens=budget, grad_accum=t.grad_accum * world.size)
    )
    return shared, Notice(
        topic="processes",
        message=(
            f"{world.size} processes train together: each step's {world.size * t.grad_accum} micro-batches of up to "
            f"{budget:,} tokens are dealt out {t.grad_accum} per process, the same {t.batch_tokens * t.grad_accum:,} "
            "tokens per step as one process with the config's batch; gradients are summed over the processes before "
            f"each update (config.toml records batch_tokens = {budget}, grad_accum = {t.grad_accum * world.size})"
        ),
    )

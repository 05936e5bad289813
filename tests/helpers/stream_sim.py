"""A CPU stand-in for CUDA streams that finds races between a side stream's copies and the compute stream.

`StreamSim` has the calls `CudaCopier` makes (`Stream`, `Event`, `current_stream`, `stream`, `record_stream`); a
copier built on it runs on the CPU with real data, while the simulator checks the *order* CUDA would guarantee.
Inside `with sim.recording():` every aten op the CPU runs is logged (a TorchDispatchMode) as work on the stream that
is current then (the compute stream unless inside `sim.stream(side)`), with the storages it reads and writes.

Happens-before is tracked with vector clocks, exactly as CUDA orders work and no more: stream order, `wait_stream`,
`wait_event` on a recorded event, and host synchronizations (`Event.synchronize`, `.item()`, `torch.equal`: work
queued after them comes after what they waited for). The GPU may run any two operations that are not ordered in
either order, so two accesses to the same storage from different streams, one of them a write, that are not
ordered are a race: reported even though the CPU ran them in a harmless order.

The CUDA caching allocator is modelled too:
- memory handed out on the compute stream may still be in use by compute work queued before (its block was freed
  on that stream and is reused at once): the allocating op counts as a compute-stream write of the new storage,
  so a side stream writing into fresh memory must wait for the compute stream first;
- a storage that a side stream used and that is freed without `record_stream(storage, side)` may be reused by the
  compute stream at once: the side stream's use must be ordered before the free;
- pinned host memory (`sim.host(tensor)`) is exempt from the second rule: torch's pinned allocator records an event
  for every non_blocking copy that touches it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

PRUNE_EVERY = 4096  # ops between sweeps of storages freed since (only memory: their history no longer matters)
COMPUTE = 0  # the index of the compute stream (the one current outside `sim.stream(...)`)


@dataclass
class _Access:
    """The last write and the last access (read or write) of a storage on one stream: op index and name."""

    write: int = 0
    write_op: str = ""
    any: int = 0
    any_op: str = ""


@dataclass
class _StorageState:
    ref: StorageWeakRef
    nbytes: int
    born: str  # the op that first showed this storage, for messages
    per_stream: dict[int, _Access] = field(default_factory=dict)
    recorded: set[int] = field(default_factory=set)  # streams named in record_stream
    host: bool = False


class SimStream:
    """A stream: ops queued on it run in order; it can wait for another stream or an event."""

    def __init__(self, sim: StreamSim, index: int):
        self.sim, self.index = sim, index

    def wait_stream(self, other: SimStream) -> None:
        self.sim._join(self.index, self.sim._clock(other.index))

    def wait_event(self, event: SimEvent) -> None:
        if event.clock is not None:  # CUDA: waiting for a never-recorded event is a no-op
            self.sim._join(self.index, event.clock)

    def synchronize(self) -> None:
        self.sim._host_waits(self.sim._clock(self.index))

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "compute stream" if self.index == COMPUTE else f"side stream {self.index}"


class SimEvent:
    """An event: `record` captures what its stream has queued so far."""

    def __init__(self, sim: StreamSim, enable_timing: bool = False):
        self.sim = sim
        self.clock: dict[int, int] | None = None

    def record(self, stream: SimStream | None = None) -> None:
        stream = stream if stream is not None else self.sim.current
        self.clock = self.sim._clock(stream.index)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.clock is not None:
            self.sim._host_waits(self.clock)

    def elapsed_time(self, end: SimEvent) -> float:
        return 0.0


class StreamSim:
    """The stream API of `CudaCopier` on the CPU, with a race detector. `races` lists what it found, in words."""

    def __init__(self):
        self.compute = SimStream(self, COMPUTE)
        self.current = self.compute
        self._streams = [self.compute]
        self._clocks: list[dict[int, int]] = [{COMPUTE: 0}]
        self._host: dict[int, int] = {}  # what the host has seen complete
        self._states: dict[int, _StorageState] = {}
        self._side_used: dict[int, _StorageState] = {}
        self.races: list[str] = []
        self.ops = 0
        self.copies_on_side = 0

    # ---- the API CudaCopier calls ----
    def Stream(self, device=None) -> SimStream:  # mirrors torch.cuda.Stream
        stream = SimStream(self, len(self._streams))
        self._streams.append(stream)
        self._clocks.append({stream.index: 0})
        return stream

    def Event(self, enable_timing: bool = False) -> SimEvent:  # mirrors torch.cuda.Event
        return SimEvent(self, enable_timing)

    def current_stream(self, device=None) -> SimStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: SimStream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def record_stream(self, tensor: torch.Tensor, stream: SimStream) -> None:
        self._state(tensor.untyped_storage(), "record_stream").recorded.add(stream.index)

    # ---- marking memory ----
    def host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mark `tensor`'s storage as pinned host memory."""
        self._state(tensor.untyped_storage(), "pinned allocation").host = True
        return tensor

    @contextlib.contextmanager
    def recording(self):
        """Log every aten op run inside as work on the current stream."""
        with _Recorder(self):
            yield
        self._check_frees()

    # ---- clocks ----
    @staticmethod
    def _merge(into: dict[int, int], other: dict[int, int]) -> None:
        for k, v in other.items():
            if into.get(k, 0) < v:
                into[k] = v

    def _clock(self, index: int) -> dict[int, int]:
        """A copy of what stream `index` has queued so far (with what the host already saw complete)."""
        self._merge(self._clocks[index], self._host)
        return dict(self._clocks[index])

    def _join(self, index: int, clock: dict[int, int]) -> None:
        self._merge(self._clocks[index], clock)

    def _host_waits(self, clock: dict[int, int]) -> None:
        self._merge(self._host, clock)

    def _tick(self, index: int) -> dict[int, int]:
        clock = self._clocks[index]
        self._merge(clock, self._host)
        clock[index] = clock.get(index, 0) + 1
        return clock

    # ---- storages ----
    def _state(self, storage: torch.UntypedStorage, op: str) -> _StorageState:
        key = storage._cdata
        state = self._states.get(key)
        if state is not None and state.ref.expired():
            self._freed(state)
            state = None
        if state is None:
            state = _StorageState(StorageWeakRef(storage), storage.nbytes(), op)
            self._states[key] = state
        return state

    def _freed(self, state: _StorageState) -> None:
        self._side_used.pop(state.ref.cdata, None)
        self._states.pop(state.ref.cdata, None)
        if state.host:
            return
        compute = self._clock(COMPUTE)
        for index, access in state.per_stream.items():
            if index != COMPUTE and index not in state.recorded and access.any > compute.get(index, 0):
                self.races.append(
                    f"a {_size(state.nbytes)} storage (from {state.born}) was freed without record_stream while "
                    f"side stream {index} may still run {access.any_op} on it: the allocator may hand it to the "
                    "compute stream at once"
                )

    def _check_frees(self) -> None:
        for state in [s for s in self._side_used.values() if s.ref.expired()]:
            self._freed(state)

    def _access(self, storage: torch.UntypedStorage, write: bool, op: str, index: int, clock: dict[int, int]):
        state = self._state(storage, op)
        for other, seen in state.per_stream.items():
            if other == index:
                continue
            last, last_op = (seen.any, seen.any_op) if write else (seen.write, seen.write_op)
            if last > clock.get(other, 0):
                before = (
                    f"was just allocated by {last_op} on the compute stream (compute work queued before may "
                    "still use the block)"
                    if last_op == state.born and other == COMPUTE
                    else f"{last_op} on {self._streams[other]} {'uses' if write else 'writes'}"
                )
                self.races.append(
                    f"{op} on {self._streams[index]} {'writes' if write else 'reads'} a "
                    f"{_size(state.nbytes)} storage (from {state.born}) that {before}, and nothing "
                    "orders the two"
                )
        access = state.per_stream.setdefault(index, _Access())
        access.any, access.any_op = clock[index], op
        if write:
            access.write, access.write_op = clock[index], op
        if index != COMPUTE:
            self._side_used[storage._cdata] = state

    def _record_op(self, func, args, kwargs, out) -> None:
        self.ops += 1
        schema = func._schema
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        reads, writes = [], []
        for i, argument in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            mutated = argument.alias_info is not None and argument.alias_info.is_write
            for t in _tensors(value):
                (writes if mutated else reads).append(t.untyped_storage())
        inputs = {s._cdata for s in reads + writes}
        outputs = [t.untyped_storage() for t in _tensors(out)]
        writes += [s for s in outputs if s._cdata not in inputs]  # an output sharing an input's storage is a view
        if not writes:  # a view or metadata op (view, slice, detach, ...): it touches no data
            return
        index = self.current.index
        clock = self._tick(index)
        if index != COMPUTE:
            self.copies_on_side += 1
        op = f"aten.{name} #{self.ops}"
        for storage in reads:
            if storage._cdata not in {w._cdata for w in writes}:
                self._access(storage, False, op, index, clock)
        for storage in writes:
            self._access(storage, True, op, index, clock)
        if isinstance(out, (bool, int, float)):  # the host read a value: it waited for this op
            self._host_waits(dict(clock))
        if self._side_used:
            self._check_frees()
        if self.ops % PRUNE_EVERY == 0:
            for key in [k for k, st in self._states.items() if k not in self._side_used and st.ref.expired()]:
                del self._states[key]


def _tensors(value) -> list[torch.Tensor]:
    return [
        t
        for t in tree_leaves(value)
        if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.untyped_storage().nbytes() > 0
    ]


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} B"


class _Recorder(TorchDispatchMode):
    def __init__(self, sim: StreamSim):
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.sim._record_op(func, args, kwargs, out)
        return out

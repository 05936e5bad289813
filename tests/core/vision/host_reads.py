"""Reads that make a CUDA host wait, found on the CPU: a test helper for the no-host-sync checks of vision steps.

On a GPU, `item()`, `tolist()`, a tensor's truth value, boolean-mask indexing, `nonzero`, `masked_select` and
`repeat_interleave` without an output size all make the host wait for the device (the output's size or value is
known only there). On the CPU nothing waits, so a step can be checked here by recording those calls instead. Tensors
that stay on the host in a real run (the batch's image grid) are allowed, and so is anything computed from them
alone: they are followed through every op.
"""

from __future__ import annotations

import sys
import traceback
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Tensor methods that read a value on the host.
_READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__"}
# Ops whose output size depends on the input's values.
_SIZED_BY_VALUES = {
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.unique_consecutive.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
}


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class HostReads:
    """Context manager: `found` lists (what, where) for every read that would wait on a GPU.

    Args:
        host: tensors that live on the host in a real run; reads of them, and of tensors made from them alone,
            are not counted.
        host_code: functions that run on the host in a real run (code that builds metadata before copying it over,
            the CPU stand-ins for CUDA kernels); nothing they read, directly or through what they call, is counted.
    """

    def __init__(self, host=(), host_code=()):
        self._host_code = {fn.__code__ for fn in host_code}
        self._host: dict[int, weakref.ref] = {}  # id -> the tensor (tensors compare by value, so no WeakSet)
        self._mark(host)
        self.found: list[tuple[str, str]] = []
        outer = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in _READS and args and isinstance(args[0], torch.Tensor) and not outer._is_host(args[0]):
                    outer._record(name)
                return func(*args, **(kwargs or {}))

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                inputs = _tensors((args, kwargs))
                out = func(*args, **(kwargs or {}))
                from_host = bool(inputs) and all(outer._is_host(t) for t in inputs)
                if from_host:
                    outer._mark(_tensors(out))
                elif outer._waits(str(func), args, kwargs or {}):
                    outer._record(str(func))
                return out

        self._modes = (_Functions(), _Ops())

    def _mark(self, tensors) -> None:
        for t in tensors:
            self._host[id(t)] = weakref.ref(t)

    def _is_host(self, tensor: torch.Tensor) -> bool:
        ref = self._host.get(id(tensor))
        return ref is not None and ref() is tensor

    @staticmethod
    def _waits(name: str, args, kwargs) -> bool:
        if name in _SIZED_BY_VALUES or name == "aten._local_scalar_dense.default":
            return True
        if name == "aten.repeat_interleave.Tensor":
            return kwargs.get("output_size") is None
        if name in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"):
            return any(t.dtype == torch.bool for t in _tensors(args[1]))
        return False

    def _record(self, what: str) -> None:
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code in self._host_code:
                return
            frame = frame.f_back
        stack = [
            f
            for f in traceback.extract_stack()[:-2]
            if "host_reads.py" not in f.filename and "/torch/" not in f.filename
        ]
        where = f"{stack[-1].filename.rsplit('/', 3)[-1]}:{stack[-1].lineno}" if stack else "?"
        self.found.append((what, where))

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

"""When Hone's Triton kernels run, and how they are launched.

A kernel runs compiled on CUDA tensors. On CPU tensors it runs only when `TRITON_INTERPRET=1` is set (read at
call time), through Triton's interpreter, which is how the kernels are tested on machines without a GPU.
Everything else, and anything inside a `torch.compile` region (where inductor writes its own fused code),
takes the plain-torch reference path. On `meta` tensors (shapes only, as step plans use them) the Triton path is
taken but no kernel runs: the launcher only tells `META_KERNEL_OBSERVER`, when one is set, what it would launch.

Kernels in this package use only Triton builtins (no `tl.sum`, `tl.zeros`, `tl.sigmoid`, ...: those are
`@triton.jit` functions, which the interpreter can only call when it was switched on before `triton` was
imported). Row sums are written `tl.reduce(x, axis, sum_combine)`, which both the compiler and the
interpreter run natively.
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    from triton.language.standard import _sum_combine as sum_combine
    from triton.runtime.interpreter import InterpretedFunction

    HAS_TRITON = True
except ImportError:  # pragma: no cover - platforms without triton (macOS): references only
    triton = None
    sum_combine = None
    InterpretedFunction = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "META_KERNEL_OBSERVER", "interpreting", "launcher", "num_programs", "sum_combine",
           "use_triton"]

# Called as `observer(kernel_name, args)` for each launch on meta tensors (step plans count its bytes); None = off.
META_KERNEL_OBSERVER = None


def interpreting() -> bool:
    """True when the user asked for Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """Whether the Triton kernel (rather than the torch reference) should run on these tensors."""
    if not HAS_TRITON or torch.compiler.is_compiling():
        return False
    devices = {t.device.type for t in tensors if t is not None}
    if devices == {"cuda"} or devices == {"meta"}:
        return True
    return devices == {"cpu"} and interpreting()


@functools.cache
def _interpreted(kernel):
    return InterpretedFunction(kernel.fn)


class _MetaLaunch:
    """`kernel[grid](*args)` on meta tensors: runs nothing, reports the launch to `META_KERNEL_OBSERVER`."""

    def __init__(self, kernel):
        self.name = getattr(getattr(kernel, "fn", kernel), "__name__", "triton_kernel")

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs) -> None:
        if META_KERNEL_OBSERVER is not None:
            META_KERNEL_OBSERVER(self.name, args)


def launcher(kernel, device: torch.device):
    """The launchable form of a `@triton.jit` kernel for tensors on `device`."""
    if device.type == "meta":
        return _MetaLaunch(kernel)
    if device.type == "cuda" or isinstance(kernel, InterpretedFunction):
        return kernel
    return _interpreted(kernel)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_programs(device: torch.device, work_items: int, per_sm: int = 4) -> int:
    """Programs for a persistent-style grid: a few per SM on CUDA, a handful in the interpreter."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return max(1, min(work_items, _sm_count(index) * per_sm))
    # The interpreter runs programs one after another; few programs keep the Python loop short.
    return max(1, min(work_items, 2))


def compile_options(device: torch.device, **options) -> dict:
    """Launch options for the compiler (e.g. `enable_fp_fusion`); the interpreter takes none."""
    return options if device.type == "cuda" else {}

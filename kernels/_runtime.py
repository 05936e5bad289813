"""When Hone's Triton kernels run, and how they are launched.

A kernel runs compiled on CUDA tensors, and on CPU tensors through Triton's interpreter when `TRITON_INTERPRET=1`
is set (read at call time), which is how the kernels are tested without a GPU. Everything else, and anything inside
a `torch.compile` region, takes the plain-torch reference path (`use_triton`). Kernels get their launchable form
from `launcher`: on CUDA a `CachedLaunch`, which skips Triton's per-launch Python work once a kernel is compiled
(docs/performance/host-time.md), on `meta` tensors nothing that runs.
"""

from __future__ import annotations

import functools
import inspect
import os

import torch

try:
    import triton

    # Kernels in this package, the grouped GEMMs aside, use only Triton builtins (no `tl.sum`, `tl.zeros`,
    # `tl.sigmoid`, ...: those are `@triton.jit` functions, which the interpreter can only call when it was switched
    # on before `triton` was imported). Row sums are written `tl.reduce(x, axis, sum_combine)`, which both the
    # compiler and the interpreter run natively. The grouped GEMM kernels (kernels/moe/grouped_gemm/) use `tl.zeros`
    # and `tl.sum`: they run interpreted only when TRITON_INTERPRET=1 was set before import (`launch.interpreting`).
    from triton.language.standard import _sum_combine as sum_combine
    from triton.runtime.interpreter import InterpretedFunction

    HAS_TRITON = True
except ImportError:  # pragma: no cover - platforms without triton (macOS): references only
    triton = None
    sum_combine = None
    InterpretedFunction = None
    HAS_TRITON = False

__all__ = [
    "CACHED_LAUNCH",
    "HAS_TRITON",
    "META_KERNEL_OBSERVER",
    "CachedLaunch",
    "cdiv",
    "interpreting",
    "launcher",
    "next_power_of_2",
    "num_programs",
    "sum_combine",
    "use_triton",
]

# Called as `observer(kernel_name, args)` for each launch on meta tensors (step plans count its bytes); None = off.
META_KERNEL_OBSERVER = None
# Launch CUDA kernels through `CachedLaunch`; `HONE_TRITON_CACHED_LAUNCH=0` turns it off. Read by `launcher` at each
# call.
CACHED_LAUNCH = os.environ.get("HONE_TRITON_CACHED_LAUNCH", "1") != "0"


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids (`triton.cdiv` is a constexpr function now, slow to call from Python)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, as `triton.next_power_of_2` (plain Python; 1 for n = 0, where Triton says 0)."""
    return 1 << max(n - 1, 0).bit_length()


def interpreting() -> bool:
    """True when the user asked for Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """Whether the Triton kernel (rather than the torch reference) should run on these tensors.

    True on CUDA tensors; on CPU tensors only under `TRITON_INTERPRET=1`; never without Triton or inside a
    `torch.compile` region (where inductor writes its own fused code). On `meta` tensors (shapes only, as step plans
    use them) the Triton path is taken but no kernel runs: the launcher only tells `META_KERNEL_OBSERVER`, when one
    is set, what it would launch.
    """
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


_INT32_MIN, _INT32_END = -(2**31), 2**31
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _argument_key(args: tuple) -> tuple | None:
    """What Triton specializes a compiled kernel on, for positional launch arguments: a tensor's dtype and 16-byte
    alignment, an integer being 1, a multiple of 16 and within int32, a float being a float, a bool's value.
    Where this is finer than Triton's own key, a new key costs one launch through Triton, which finds the kernel
    it compiled before. None for an argument of another kind: then Triton's own path runs.

    This runs at every launch: exact type checks (no isinstance walks) and one small value per argument.
    """
    key = []
    append = key.append
    for a in args:
        kind = type(a)
        if kind is int:
            # 1 -> "one", else bit 1: a multiple of 16, bit 2: outside int32
            append("one" if a == 1 else (not a % 16) | (not _INT32_MIN <= a < _INT32_END) << 1)
        elif kind in _PLAIN_TENSORS:
            append((a.dtype, not a.data_ptr() % 16))
        elif kind is float:
            append(float)
        elif kind is bool or a is None:
            append(a)
        else:
            return None
    return tuple(key)


class CachedLaunch:
    """`kernel[grid](*args, **kwargs)` for a `@triton.jit` kernel on CUDA, with Triton's per-launch work cached.

    Triton's own `kernel[grid](...)` spends Python time on every launch (argument binding, option and environment
    lookups); on small models that is a large share of the host time of a step that the GPU waits on
    (docs/performance/host-time.md). `CachedLaunch` keys each call on what Triton specializes a compiled kernel on
    (`_argument_key`), lets Triton compile (and launch) the first call of a key, and launches later calls of that
    key through the compiled kernel directly. `HONE_TRITON_CACHED_LAUNCH=0` turns it off.

    Runtime arguments are positional and compile-time ones (constexprs, num_warps, ...) keywords, as every launch
    in this package passes them. The first call of a key goes through Triton (which compiles when it has to, and
    launches); the compiled kernel it returns is kept with the launch arguments its signature adds after the
    positional ones (the constexprs, defaults filled in), and later calls of the key launch it directly with the
    stream, hooks and launch metadata Triton would pass.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self._parameters = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())
        self._compiled: dict[tuple, tuple] = {}

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        arg_key = None if callable(grid) else _argument_key(args)
        if arg_key is None:
            return self.kernel[grid](*args, **kwargs)
        driver = _driver()
        device = driver.get_current_device()
        key = (device, arg_key, tuple(kwargs.items()))
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.kernel[grid](*args, **kwargs)
            entry = self._entry(compiled, len(args), kwargs)
            if entry is not None:
                self._compiled[key] = entry
            return compiled
        compiled, tail = entry
        stream = driver.get_current_stream(device)
        grid = (*grid, 1, 1)
        hooks = triton.knobs.runtime
        launch_args = (*args, *tail)
        compiled.run(
            grid[0],
            grid[1],
            grid[2],
            stream,
            compiled.function,
            compiled.packed_metadata,
            compiled.launch_metadata(grid[:3], stream, *launch_args),
            hooks.launch_enter_hook,
            hooks.launch_exit_hook,
            *launch_args,
        )
        return compiled

    def _entry(self, compiled, positional: int, kwargs: dict) -> tuple | None:
        """(compiled kernel, the signature's values after the positional arguments), or None when this kernel
        cannot be launched directly (an older Triton's launcher takes other arguments)."""
        if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata", "launch_metadata")):
            return None
        tail = []
        for param in self._parameters[positional:]:
            if param.name in kwargs:
                tail.append(kwargs[param.name])
            elif param.default is not inspect.Parameter.empty:
                tail.append(param.default)
            else:
                return None
        return compiled, tuple(tail)


@functools.cache
def _driver():
    return triton.runtime.driver.active


@functools.cache
def _launch_api_known() -> bool:
    """Triton >= 3.3 passes a kernel's constexprs to its launcher and has `triton.knobs` (what CachedLaunch
    mirrors); older ones launch through their own path."""
    major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    return (major, minor) >= (3, 3) and hasattr(triton, "knobs")


@functools.cache
def _cached(kernel) -> CachedLaunch:
    return CachedLaunch(kernel)


def launcher(kernel, device: torch.device):
    """The launchable form of a `@triton.jit` kernel for tensors on `device`."""
    if device.type == "meta":
        return _MetaLaunch(kernel)
    if device.type == "cuda":
        return _cached(kernel) if CACHED_LAUNCH and _launch_api_known() else kernel
    if isinstance(kernel, InterpretedFunction):
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

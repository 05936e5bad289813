"""`triton` and `triton.language` for the kernel modules, or stand-ins where Triton is not installed (a CPU install).

With the stand-ins a module still defines its kernels, as placeholders: `_runtime.use_triton` is False without
Triton, so every entry point takes its plain-torch reference and no placeholder is ever launched; one that were
would say which kernel and why. The kernels' annotations (`tl.constexpr`) are never evaluated: every kernel module
has `from __future__ import annotations`.
"""

from __future__ import annotations

import functools
import types

try:
    import triton
    import triton.language as tl
except ImportError:

    class _NoTritonKernel:
        """A `@triton.jit` function defined where Triton is not installed."""

        def __init__(self, fn):
            functools.update_wrapper(self, fn)

        def _missing(self, *args, **kwargs):
            raise RuntimeError(
                f"{self.__name__} is a Triton kernel and Triton is not installed; its torch "
                "reference should have run (hone.kernels._runtime.use_triton)"
            )

        __call__ = _missing
        __getitem__ = _missing  # kernel[grid](...)

    def _jit(fn=None, **_options):
        return _NoTritonKernel(fn) if fn is not None else _NoTritonKernel

    triton = types.SimpleNamespace(jit=_jit, __version__=None)
    tl = types.SimpleNamespace()

__all__ = ["tl", "triton"]

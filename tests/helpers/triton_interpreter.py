"""Whether Triton's CPU interpreter runs here at all: the interpreted kernel tests mean something only where it does.

Triton 3.6's interpreter (the GPU machine's Triton, which the installers pin) raises "only 0-dimensional arrays can
be converted to Python scalars" with NumPy >= 2.4 on every kernel; Triton 3.9 runs. Where it cannot run, the
interpreted tests skip with that reason (tests/conftest.py) instead of failing on Triton's own code.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

# A kernel that any working interpreter runs: out = x + 1 over 10 values, in a loop with a bound known at run time
# (Hone's kernels loop over rows and columns that way; Triton 3.6 fails there with NumPy >= 2.4).
_PROBE = """
import torch, triton, triton.language as tl

@triton.jit
def add_one(x, out, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        tl.store(out + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

x = torch.arange(10, dtype=torch.float32)
out = torch.empty_like(x)
add_one[(1,)](x, out, 10, BLOCK=4)
assert torch.equal(out, x + 1), out
"""


@functools.cache
def interpreter_fault() -> str | None:
    """Why Triton's interpreter cannot run a trivial kernel in this environment, or None when it can."""
    try:
        import numpy
        import triton
    except ImportError as e:
        return f"Triton's interpreter is not available: {e}"
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    return (
        f"Triton {triton.__version__}'s interpreter cannot run a kernel here (NumPy {numpy.__version__}): {last[:300]}"
    )

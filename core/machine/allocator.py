"""The CUDA allocator setting Hone's processes start with: expandable segments, unless the user chose a setting.

A run sized close to its GPU's memory fails on the caching allocator's fragmented blocks before it runs out of
memory in earnest: under an 8 GiB cap a Qwen3-8B QLoRA step needing 7.1 GiB ran out at step 1 with fixed-size
segments and ran through with expandable ones (docs/performance/memory-planner.md). The setting must be in the
environment before torch makes its first CUDA allocation, so the entry points set it first thing. Stdlib only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"
# Names torch reads the allocator settings from (the CUDA one, its newer device-neutral name, the ROCm one).
ALLOC_ENVS = (ALLOC_ENV, "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"


def prefer_expandable_segments(environ: MutableMapping[str, str] | None = None, platform: str | None = None) -> bool:
    """Ask torch's CUDA allocator for expandable segments; True when this set it.

    Left alone: a setting the user gave in any of torch's variables, and platforms other than Linux (torch's
    Windows builds do not support expandable segments and warn about them).
    """
    environ = os.environ if environ is None else environ
    if (platform or sys.platform) != "linux" or any(name in environ for name in ALLOC_ENVS):
        return False
    environ[ALLOC_ENV] = EXPANDABLE
    return True

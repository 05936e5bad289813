"""Grouped GEMMs over expert-sorted rows: the Triton kernels, their launchers and plain-torch references, and the
block-size tuning remembered per GPU and shape.

    kernels.py  the Triton kernels (forward with an optional LoRA term, weight gradient)
    launch.py   grouped_gemm_forward / grouped_gemm_wgrad and their references
    tuning.py   block sizes timed once per (GPU, kernel, shape), kept in the folder the caller names
"""

__all__: list[str] = []

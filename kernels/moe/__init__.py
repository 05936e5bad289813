"""Mixture-of-experts kernels: routing grouped once, grouped GEMMs, the experts layer and its gated activation.

routing.py      every (token, slot) pair sorted by expert, with group ends, on the device
router.py       softmax + top-k (+ renormalization) of a router's logits in one kernel each way
grouped_gemm/   Triton grouped GEMMs: kernels.py, launch.py (launchers + references), tuning.py
backends.py     the grouped-GEMM primitives per backend (grouped_mm, triton, torch)
experts.py      one experts layer as a single autograd function, with split LoRA on the experts
glu.py          the experts' silu(gate) * up on concatenated halves, forward and backward
"""

__all__: list[str] = []

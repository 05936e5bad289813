"""Hone's fused Triton kernels (`hone.kernels`) put into a loaded model's modules, each change undoable.

apply.py        apply_kernels / revert_kernels: norms, residual adds, rope, activations, LoRA layers
patching.py     per-instance forward swaps that keep transformers' wrappers (the undo mechanism)
lora_layers.py  peft LoRA layers routed through the LoRA linear kernel (dense and nf4 bases)

The fused MoE router (its LoRA linear plus one softmax + top-k kernel) lives with the MoE path: moe/fused_router.py.
"""

__all__: list[str] = []

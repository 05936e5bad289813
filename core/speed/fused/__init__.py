"""Hone's fused Triton kernels (`hone.kernels`) put into a loaded model's modules, each change undoable.

    apply.py        apply_kernels / revert_kernels: norms, residual adds, rope, activations, LoRA layers
    patching.py     per-instance forward swaps that keep transformers' wrappers (the undo mechanism)
    lora_layers.py  peft LoRA layers routed through the LoRA linear kernel (dense and nf4 bases)
    router.py       a MoE router with LoRA as the LoRA linear plus one softmax + top-k kernel
"""

__all__: list[str] = []

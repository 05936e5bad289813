"""What the Model page and the run events say about a model. Stdlib only, so the GUI can hold it without torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a model, read from its config (no weights needed)."""

    name: str  # what the user typed / picked
    source_kind: str  # bundled | gguf | folder | hub
    architecture: str  # e.g. Qwen3ForCausalLM
    model_type: str  # e.g. qwen3
    params: int  # total parameters
    layers: int
    hidden_size: int
    vocab_size: int
    context_length: int
    is_moe: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    is_vision: bool = False

    def summary(self) -> str:
        kind = f"MoE {self.num_experts} experts, top-{self.experts_per_token}" if self.is_moe else "dense"
        vision = ", vision" if self.is_vision else ""
        return (f"{self.architecture}: {self.params / 1e9:.2f}B params, {self.layers} layers, {kind}{vision}, "
                f"context {self.context_length}")

"""What the Model page and the run events say about a model. Stdlib only, so the GUI can hold it without torch."""

from __future__ import annotations

from dataclasses import dataclass

# The config keys MoE families use for their number of routed experts, and for experts per token (first set wins).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k")


def config_value(config, keys: tuple[str, ...]) -> int:
    """The first of `keys` set on `config` (an object or a dict), as an int; 0 when none is."""
    get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
    return next((int(value) for key in keys if (value := get(key))), 0)


def attention_head_dim(config) -> int:
    """The query/key head dim: qk_nope + qk_rope for multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash), whose
    `head_dim` is only the rotary part; else `head_dim`, or hidden size / heads."""
    get = config.get if isinstance(config, dict) else (lambda key: getattr(config, key, None))
    if get("qk_nope_head_dim") and get("qk_rope_head_dim"):
        return int(get("qk_nope_head_dim")) + int(get("qk_rope_head_dim"))
    return int(get("head_dim") or int(get("hidden_size")) // int(get("num_attention_heads")))


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
        return (
            f"{self.architecture}: {self.params / 1e9:.2f}B params, {self.layers} layers, {kind}{vision}, "
            f"context {self.context_length}"
        )

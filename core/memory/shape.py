"""A model's sizes, as the memory planner needs them, from its transformers config alone (no weights read).

`ModelShape.from_config` takes a transformers config object or its dict (config.json). `load_model_config` reads the
config of a run's model: a Hub id or local folder through `AutoConfig` (config.json only), a GGUF file through its
metadata, and the benchmark shapes by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hone.core.model_info import EXPERT_COUNT_KEYS, EXPERTS_PER_TOKEN_KEYS, attention_head_dim, config_value


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only (or a vision model's language) transformer.

    `experts` is 0 for a dense model; then `expert_intermediate` and `top_k` are 0 too. `dense_layers` counts the
    layers that keep a dense MLP in a mixture-of-experts model (DeepSeek's first layers, Qwen's mlp_only_layers).
    """

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: int = 0
    name: str = ""

    @classmethod
    def from_config(cls, config: Any, name: str = "") -> ModelShape:
        get: Callable[..., Any] = (  # values are whatever the config holds; int() refuses a missing one
            config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
        )
        text = get("text_config")  # vision-language models: the language model's own config
        if text is not None:
            return cls.from_config(text, name)
        hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        experts = config_value(config, EXPERT_COUNT_KEYS)
        layers = int(get("num_hidden_layers"))
        dense_layers = 0
        if experts:
            dense_layers = int(get("first_k_dense_replace") or 0) + len(get("mlp_only_layers") or [])
        shared = int(get("shared_expert_intermediate_size") or 0)
        if not shared and get("n_shared_experts"):
            shared = int(get("n_shared_experts")) * int(get("moe_intermediate_size") or 0)
        return cls(
            layers=layers,
            hidden=hidden,
            intermediate=int(get("intermediate_size") or 4 * hidden),
            heads=heads,
            kv_heads=int(get("num_key_value_heads") or heads),
            head_dim=attention_head_dim(config),
            vocab=int(get("vocab_size")),
            tied_embeddings=bool(get("tie_word_embeddings", False)),
            experts=experts,
            top_k=config_value(config, EXPERTS_PER_TOKEN_KEYS) if experts else 0,
            expert_intermediate=int(get("moe_intermediate_size") or get("intermediate_size") or 0) if experts else 0,
            shared_intermediate=shared,
            dense_layers=dense_layers,
            name=name,
        )

    # ---- parameter counts ----
    @property
    def attention_params(self) -> int:
        """q, k, v and o of one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def mlp_params(self, moe: bool) -> int:
        if not moe:
            return 3 * self.hidden * self.intermediate
        return (
            self.experts * 3 * self.hidden * self.expert_intermediate
            + self.hidden * self.experts
            + 3 * self.hidden * self.shared_intermediate
        )

    @property
    def linear_params(self) -> int:
        """Parameters of every decoder layer's linear weights (what QLoRA quantizes, experts included)."""
        dense = self.layers - self.moe_layers
        return (
            self.layers * self.attention_params
            + dense * self.mlp_params(False)
            + self.moe_layers * self.mlp_params(True)
        )

    @property
    def table_params(self) -> int:
        """The vocabulary tables: input embedding, and the LM head unless tied to it."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def lora_params(self, rank: int, experts: bool = True) -> int:
        """Trainable parameters of LoRA rank `rank` on every linear layer of the decoder (and on each expert)."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        attention = rank * ((h + q) + 2 * (h + kv) + (q + h))
        dense_mlp = rank * 3 * (h + self.intermediate)
        moe_mlp = rank * (h + self.experts)  # the router
        moe_mlp += rank * 3 * (h + self.shared_intermediate) if self.shared_intermediate else 0
        if experts:
            moe_mlp += self.experts * rank * 3 * (h + self.expert_intermediate)
        return self.layers * attention + (self.layers - self.moe_layers) * dense_mlp + self.moe_layers * moe_mlp


def load_model_config(name_or_path: str, gguf_file: str = "", revision: str = "", trust_remote_code: bool = False):
    """The transformers config of a run's model, without its weights: a benchmark shape name, a Hub id, a folder,
    a .gguf file (its metadata) or a `bundled:` name."""
    from pathlib import Path

    from hone.core.models.shapes import SHAPES, make_config

    if name_or_path in SHAPES:
        return make_config(name_or_path)
    from transformers import AutoConfig

    from hone.core.resources import resolve_bundled

    path = str(resolve_bundled(name_or_path)) if name_or_path.startswith("bundled:") else name_or_path
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **({"revision": revision} if revision else {})}
    if path.endswith(".gguf"):
        return AutoConfig.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name, **kwargs)
    if gguf_file:
        return AutoConfig.from_pretrained(path, gguf_file=gguf_file, **kwargs)
    return AutoConfig.from_pretrained(path, **kwargs)

"""Model shapes from public model configs, and random-init models built from them (no download).

One table for the benchmark scenarios and the tests. Real shapes are facts copied from each model's public
`config.json`; `tiny-*` shapes keep the architecture (GQA, MoE routing, sliding windows, tied embeddings) at a
size that runs on a CPU in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shape:
    """A transformers config, by model type and keyword arguments."""

    model_type: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def is_moe(self) -> bool:
        return any(
            k in self.kwargs for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
        )


_QWEN3_COMMON = dict(
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    max_position_embeddings=40960,
    hidden_act="silu",
    attention_bias=False,
    head_dim=128,
)

# What the tiny MoE family shapes share; routing and attention variants on top.
_TINY_MOE = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts_per_tok=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
_GROUPED_ROUTING = dict(n_routed_experts=6, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1)
_MLA = dict(
    num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16
)

SHAPES: dict[str, Shape] = {
    # Qwen/Qwen3-0.6B
    "dense-0.6b": Shape(
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        ),
        "Qwen3-0.6B shape",
    ),
    # Qwen/Qwen3-4B
    "dense-4b": Shape(
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        ),
        "Qwen3-4B shape",
    ),
    # Qwen/Qwen3-8B
    "dense-8b": Shape(
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
        ),
        "Qwen3-8B shape",
    ),
    # Qwen/Qwen3-32B: 61 GiB of bf16 weights, for runs that split the model across GPUs (train.parallel = fsdp)
    "dense-32b": Shape(
        "qwen3",
        dict(
            _QWEN3_COMMON,
            hidden_size=5120,
            intermediate_size=25600,
            num_hidden_layers=64,
            num_attention_heads=64,
            num_key_value_heads=8,
            tie_word_embeddings=False,
        ),
        "Qwen3-32B shape",
    ),
    # meta-llama/Llama-3.1-8B: the shape behind the best-known published single-GPU context lengths
    "llama-8b": Shape(
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            tie_word_embeddings=False,
            hidden_act="silu",
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        ),
        "Llama-3.1-8B shape",
    ),
    # meta-llama/Llama-3.2-1B
    "llama-1b": Shape(
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            rms_norm_eps=1e-5,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            hidden_act="silu",
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=32.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
        ),
        "Llama-3.2-1B shape",
    ),
    # Qwen/Qwen3-30B-A3B (the benchmark uses 8 of its 48 layers by default)
    "moe-qwen3": Shape(
        "qwen3_moe",
        dict(
            _QWEN3_COMMON,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
        "Qwen3-30B-A3B shape",
    ),
    # openai/gpt-oss-20b
    "moe-gptoss": Shape(
        "gpt_oss",
        dict(
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=24,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            num_local_experts=32,
            num_experts_per_tok=4,
            sliding_window=128,
            rms_norm_eps=1e-5,
            rope_theta=150000.0,
            max_position_embeddings=131072,
            swiglu_limit=7.0,
            attention_bias=True,
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="yarn",
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=4096,
            ),
        ),
        "gpt-oss-20b shape",
    ),
    # zai-org/GLM-4.7-Flash: MLA, 64 routed experts + 1 shared, grouped sigmoid routing, the first layer dense
    "moe-glm47-flash": Shape(
        "glm4_moe_lite",
        dict(
            vocab_size=154880,
            hidden_size=2048,
            intermediate_size=10240,
            moe_intermediate_size=1536,
            num_hidden_layers=47,
            num_attention_heads=20,
            num_key_value_heads=20,
            n_routed_experts=64,
            n_shared_experts=1,
            num_experts_per_tok=4,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=512,
            q_lora_rank=768,
            qk_rope_head_dim=64,
            qk_nope_head_dim=192,
            v_head_dim=256,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            max_position_embeddings=202752,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
        "GLM-4.7-Flash shape",
    ),
    # deepseek-ai/DeepSeek-V3: MLA, 256 routed experts + 1 shared, grouped sigmoid routing, the first 3 layers dense
    "moe-deepseek-v3": Shape(
        "deepseek_v3",
        dict(
            vocab_size=129280,
            hidden_size=7168,
            intermediate_size=18432,
            moe_intermediate_size=2048,
            num_hidden_layers=61,
            num_attention_heads=128,
            num_key_value_heads=128,
            n_routed_experts=256,
            n_shared_experts=1,
            num_experts_per_tok=8,
            first_k_dense_replace=3,
            n_group=8,
            topk_group=4,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        "DeepSeek-V3 shape",
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the bundled demo model's shape)
    "smollm2-135m": Shape(
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            hidden_act="silu",
            rope_theta=100000.0,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=2,
        ),
        "SmolLM2-135M shape",
    ),
    # ---- tiny versions: same architecture, CPU-sized. The vocabulary fits the SmolLM2 tokenizer used in tests.
    "tiny-dense": Shape(
        "qwen3",
        dict(
            _QWEN3_COMMON,
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=True,
        ),
        "tiny Qwen3",
    ),
    "tiny-llama": Shape(
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            hidden_act="silu",
        ),
        "tiny Llama",
    ),
    "tiny-mistral-swa": Shape(
        "mistral",
        dict(
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
        "tiny Mistral with an 8-token window",
    ),
    "tiny-moe-qwen3": Shape(
        "qwen3_moe",
        dict(
            _QWEN3_COMMON,
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
        "tiny Qwen3-MoE",
    ),
    "tiny-moe-gptoss": Shape(
        "gpt_oss",
        dict(
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            rms_norm_eps=1e-5,
            max_position_embeddings=4096,
            swiglu_limit=7.0,
            attention_bias=True,
            tie_word_embeddings=False,
        ),
        "tiny gpt-oss",
    ),
    "tiny-moe-qwen2": Shape(
        "qwen2_moe",
        dict(
            vocab_size=49152,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
        ),
        "tiny Qwen2-MoE (shared expert)",
    ),
    # ---- tiny versions of the other MoE families transformers ships (hone.core.speed.moe.families): every expert
    # dimension distinct (intermediate 24, 5 or 6 experts), two or three layers.
    **{
        f"tiny-moe-{name}": Shape(model_type, dict(_TINY_MOE, **kwargs), f"tiny {description}")
        for name, model_type, description, kwargs in (
            ("mixtral", "mixtral", "Mixtral", dict(num_local_experts=5)),
            ("olmoe", "olmoe", "OLMoE", dict(num_experts=5)),
            ("granite", "granitemoe", "Granite-MoE", dict(num_local_experts=5)),
            ("minimax-m2", "minimax_m2", "MiniMax-M2", dict(num_local_experts=5)),
            (
                "ernie",
                "ernie4_5_moe",
                "ERNIE-4.5-MoE (shared expert, first layer dense)",
                dict(
                    moe_num_experts=5, moe_num_shared_experts=1, moe_layer_start_index=1, moe_k=2, num_hidden_layers=3
                ),
            ),
            (
                "glm4",
                "glm4_moe",
                "GLM-4.5 (sigmoid group-limited routing, shared expert, first layer dense)",
                dict(_GROUPED_ROUTING, num_hidden_layers=3),
            ),
            ("glm4-lite", "glm4_moe_lite", "GLM-4.7-Flash (MLA)", dict(_GROUPED_ROUTING, **_MLA, num_hidden_layers=3)),
            (
                "deepseek-v3",
                "deepseek_v3",
                "DeepSeek-V3 (MLA)",
                dict(_GROUPED_ROUTING, **{**_MLA, "head_dim": 8}, num_hidden_layers=3),
            ),
            (
                "deepseek-v32",
                "deepseek_v32",
                "DeepSeek-V3.2 (MLA with a sparse-attention indexer)",
                dict(
                    _GROUPED_ROUTING,
                    **{**_MLA, "head_dim": 8},
                    num_hidden_layers=3,
                    index_topk=6,
                    index_head_dim=16,
                    index_n_heads=2,
                ),
            ),
            (
                "lfm2",
                "lfm2_moe",
                "LFM2-MoE (short convolutions, first layer dense)",
                dict(
                    num_experts=5,
                    num_dense_layers=1,
                    num_hidden_layers=3,
                    layer_types=["conv", "full_attention", "conv"],
                ),
            ),
            (
                "qwen3-next",
                "qwen3_next",
                "Qwen3-Next (Gated DeltaNet layers, shared expert)",
                dict(
                    num_experts=5,
                    shared_expert_intermediate_size=32,
                    num_hidden_layers=4,
                    linear_num_value_heads=4,
                    linear_num_key_heads=2,
                    linear_key_head_dim=16,
                    linear_value_head_dim=16,
                    linear_conv_kernel_dim=4,
                ),
            ),
        )
    },
}


def make_config(shape: Shape | str, layers: int | None = None, **overrides: Any):
    """A transformers config for a shape, optionally with fewer layers."""
    from transformers import AutoConfig

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    kwargs = dict(shape.kwargs, **overrides)
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
        if shape.model_type == "gpt_oss":
            kwargs["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return AutoConfig.for_model(shape.model_type, **kwargs)


def build_model(
    shape: Shape | str, layers: int | None = None, *, seed: int = 0, dtype=None, device=None, **overrides: Any
):
    """A random-init causal LM of this shape; the same seed gives the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = make_config(shape, layers, **overrides)
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model

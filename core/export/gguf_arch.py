"""What llama.cpp expects of each architecture Hone writes to GGUF: tensor names, layout and metadata keys.

Supported: llama (Llama 2/3.x, SmolLM, with llama3 rope scaling), qwen2 (Qwen2, Qwen2.5) and qwen3 (dense Qwen3).
The layout follows llama.cpp's published conventions (GGUF spec, convert_hf_to_gguf.py), written here from
scratch. `check_supported` refuses, from the config alone, any architecture or feature (sliding windows, other
rope scaling, ...) the writer does not handle.
"""

from __future__ import annotations

import re
from typing import Any

from hone.core.export.formats import ExportError

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "Llama 2 / 3.x, SmolLM and other LlamaForCausalLM models",
    "qwen2": "Qwen2 and Qwen2.5 (dense)",
    "qwen3": "Qwen3 (dense)",
}
_ADVICE = (
    "GGUF export supports "
    + ", ".join(f"{k} ({v})" for k, v in SUPPORTED_ARCHITECTURES.items())
    + "; for other models export `merged` and convert it with llama.cpp's convert_hf_to_gguf.py"
)

# Hugging Face module -> llama.cpp tensor name, each with `.weight` or `.bias`. `output` is left out when the LM head
# is tied to the embeddings (llama.cpp then reuses token_embd); blocks are `blk.N.<name>`.
_GLOBAL_TENSORS = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_BLOCK_TENSORS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_BLOCK_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def check_supported(config) -> str:
    """The GGUF architecture name for a transformers config, or ExportError saying what is supported."""
    model_type = getattr(config, "model_type", "?")
    if getattr(config, "vision_config", None) is not None:
        raise ExportError(f"GGUF export of vision-language models ({model_type}) is not supported", _ADVICE)
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ExportError(f"GGUF export does not support the {model_type} architecture", _ADVICE)
    problems = []
    if getattr(config, "attention_bias", False) and model_type != "qwen2":
        problems.append("attention biases")
    if getattr(config, "mlp_bias", False):
        problems.append("MLP biases")
    if getattr(config, "use_sliding_window", False):
        problems.append("sliding-window attention")
    rope = rope_parameters(config)
    allowed_rope = ("default", "llama3") if model_type == "llama" else ("default",)
    if rope.get("rope_type", "default") not in allowed_rope:
        problems.append(f"{rope.get('rope_type')} rope scaling")
    if problems:
        raise ExportError(
            f"this {model_type} model uses {' and '.join(problems)}, which Hone's GGUF writer does not handle", _ADVICE
        )
    return model_type


def rope_parameters(config) -> dict[str, Any]:
    """Rope settings as one dict (transformers 5 `rope_parameters`; older configs: rope_theta + rope_scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def head_dim(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def gguf_tensor_name(hf_name: str) -> str:
    """`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`; ExportError for unknown tensors."""
    module, _, suffix = hf_name.rpartition(".")
    if module in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[module]}.{suffix}"
    match = _BLOCK_NAME.match(hf_name)
    if match and match.group(2) in _BLOCK_TENSORS:
        return f"blk.{match.group(1)}.{_BLOCK_TENSORS[match.group(2)]}.{match.group(3)}"
    raise ExportError(f"the model has a tensor GGUF export does not know: {hf_name}", _ADVICE)


def permute_for_rope(rows, heads: int):
    """Reorder the output rows of a q/k projection from rotate-half order to llama.cpp's interleaved pairs.

    Within each head, rows [0..d/2) and [d/2..d) (the two halves rope rotates together) become rows 0,2,4,...
    and 1,3,5,... Works on numpy arrays or torch tensors of shape (heads * d, ...).
    """
    shape = rows.shape
    return rows.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute_for_rope(rows, heads: int):
    """The inverse of permute_for_rope."""
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _rope_heads(gguf_name: str, config, arch: str) -> int | None:
    if arch == "llama" and gguf_name.endswith((".attn_q.weight", ".attn_k.weight")):
        return config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
    return None


def to_gguf_layout(gguf_name: str, array, config, arch: str):
    """The tensor as llama.cpp stores it: q/k rows permuted for llama, everything else unchanged.

    On llama the rows of attn_q / attn_k go from Hugging Face's rotate-half order to the interleaved pairs
    llama.cpp's rope uses (`permute_for_rope`); qwen2 and qwen3 need no permutation.
    """
    heads = _rope_heads(gguf_name, config, arch)
    return array if heads is None else permute_for_rope(array, heads)


def from_gguf_layout(gguf_name: str, array, config, arch: str):
    """The inverse of to_gguf_layout: a tensor as the Hugging Face model holds it."""
    heads = _rope_heads(gguf_name, config, arch)
    return array if heads is None else unpermute_for_rope(array, heads)


def rope_freq_factors(config):
    """llama3 rope scaling as llama.cpp's rope_freqs tensor of per-frequency divisors: plain frequency / scaled
    frequency, float32 (d/2,).

    The scaled frequencies come from transformers' own llama3 rope initializer, so the GGUF computes the rotations
    the Hugging Face model computes. None when the model has no llama3 scaling.
    """
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = rope_parameters(config)
    if params.get("rope_type") != "llama3":
        return None
    dim = head_dim(config)
    plain = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return (plain / scaled.float()).numpy().astype("float32")


def model_metadata(config, arch: str) -> dict[str, tuple[Any, Any]]:
    """Architecture keys llama.cpp reads, as {key: (value, GGUFValueType)}."""
    from gguf import GGUFValueType as T

    dim = head_dim(config)
    values = {
        "context_length": (int(config.max_position_embeddings), T.UINT32),
        "embedding_length": (int(config.hidden_size), T.UINT32),
        "block_count": (int(config.num_hidden_layers), T.UINT32),
        "feed_forward_length": (int(config.intermediate_size), T.UINT32),
        "attention.head_count": (int(config.num_attention_heads), T.UINT32),
        "attention.head_count_kv": (int(config.num_key_value_heads), T.UINT32),
        "attention.key_length": (dim, T.UINT32),
        "attention.value_length": (dim, T.UINT32),
        "attention.layer_norm_rms_epsilon": (float(config.rms_norm_eps), T.FLOAT32),
        "rope.freq_base": (float(rope_parameters(config)["rope_theta"]), T.FLOAT32),
        "rope.dimension_count": (dim, T.UINT32),
        "vocab_size": (int(config.vocab_size), T.UINT32),
    }
    return {f"{arch}.{key}": value for key, value in values.items()}

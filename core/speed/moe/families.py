"""The mixture-of-experts families Hone knows, in one table: what each is called, how its router picks experts,
its attention and what of it stays on transformers' path. Stdlib only, so the Model page reads it without torch;
`hone.core.speed.moe.family_report` adds what is read from a loaded model.
"""

from __future__ import annotations

from dataclasses import dataclass

SOFTMAX = "softmax over the experts, top-k"
SIGMOID_GROUPED = "sigmoid scores with a correction bias, top-k within the best expert groups, renormalized and scaled"


@dataclass(frozen=True)
class Family:
    """One MoE family as transformers 5 implements it.

    Attributes:
        name: what users call it.
        router: how the router scores and picks experts.
        attention: the attention kind and what Hone's packed path does with it.
        plain: what runs on transformers' path for this family, and why (empty: nothing beyond the router when
            its check fails).
    """

    name: str
    router: str
    attention: str = "grouped-query attention on Hone's packed path"
    plain: str = ""


MLA = (
    "multi-head latent attention (MLA) on Hone's packed path; its q/k head dim differs from v's, so varlen runs "
    "with v padded to the q/k head dim and the output cut back"
)
LINEAR = (
    "hybrid: gated attention layers on Hone's packed path; Gated DeltaNet linear-attention layers packed too, "
    "their convolution run per sequence by Hone"
)
LINEAR_PLAIN = (
    "the Gated DeltaNet delta rule is transformers': flash-linear-attention's kernel over the packed row "
    "where it is installed and passes its check on the GPU, else the torch rule one sequence at a time"
)

FAMILIES: dict[str, Family] = {
    "qwen3_moe": Family("Qwen3-MoE", SOFTMAX + " (renormalized with norm_topk_prob)"),
    "qwen2_moe": Family("Qwen2-MoE", SOFTMAX),
    "qwen3_next": Family("Qwen3-Next", SOFTMAX + ", renormalized", LINEAR, LINEAR_PLAIN),
    "qwen3_vl_moe": Family(
        "Qwen3-VL-MoE",
        SOFTMAX + ", renormalized",
        "vision-language: transformers' attention over the packed batch",
        "attention (vision-language models keep transformers' attention)",
    ),
    "gpt_oss": Family(
        "gpt-oss",
        "top-k of the logits (with a bias), softmax over the k",
        "grouped-query attention with sink logits and alternating sliding windows on Hone's packed path",
    ),
    "mixtral": Family("Mixtral", SOFTMAX + " (top-2)"),
    "olmoe": Family("OLMoE", SOFTMAX + " (top-8, not renormalized)"),
    "phimoe": Family("Phi-MoE", "sparse-mixer top-2"),
    "granitemoe": Family("Granite-MoE", SOFTMAX),
    "granitemoeshared": Family("Granite-MoE (shared experts)", SOFTMAX),
    "ernie4_5_moe": Family("ERNIE-4.5-MoE", SOFTMAX + " with a correction bias"),
    "glm4_moe": Family(
        "GLM-4.5 / 4.6 / 4.7", SIGMOID_GROUPED, "grouped-query attention (partial rotary) on Hone's packed path"
    ),
    "glm4_moe_lite": Family("GLM-4.7-Flash", SIGMOID_GROUPED, MLA),
    "deepseek_v3": Family("DeepSeek-V3 / R1 / V3.1", SIGMOID_GROUPED, MLA),
    "deepseek_v32": Family(
        "DeepSeek-V3.2",
        SIGMOID_GROUPED,
        "MLA with a sparse-attention indexer (DSA): transformers' attention",
        "attention (its indexer picks the keys each query sees; Hone's packed kernels attend to all of a sequence)",
    ),
    "deepseek_v2": Family("DeepSeek-V2", "softmax, top-k within the best expert groups", MLA),
    "minimax_m2": Family("MiniMax-M2", "sigmoid scores with a correction bias, top-k, renormalized"),
    "lfm2_moe": Family(
        "LFM2-MoE",
        "sigmoid scores with a correction bias, top-k, renormalized",
        "hybrid: short-convolution layers and grouped-query attention layers, both keeping packed sequences apart",
    ),
    "hunyuan_v1_moe": Family("Hunyuan-MoE", SOFTMAX),
    "dots1": Family("dots.llm1", SIGMOID_GROUPED),
}


def family_of(model_type: str) -> Family | None:
    """The table's row for a config's model type (None: a family without a row, or a dense model)."""
    return FAMILIES.get(model_type)

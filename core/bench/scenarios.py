"""Benchmark scenarios: what `hone bench NAME` trains, as data (stdlib only).

A text scenario is a model shape from `hone.core.models.shapes`, how many of its layers, and the packed batch it
trains on; the real ones are the public architectures the speed claims are about, the `tiny-*` ones keep each
architecture at a size a CPU runs in milliseconds, for smoke runs and tests. A vision scenario is a vision-language
model trained through Hone's Trainer on generated rows (`hone.core.bench.vision`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.core.errors import ConfigError

# Default packed-row sizes. 16,384 tokens is the dense batch Hone's speed figures are measured on; MoE layers hold a
# (tokens x top-k) routing problem, so their batch is half of that.
DENSE_TOKENS = 16384
MOE_TOKENS = 8192
# Long rows (documents, reasoning traces): a few sequences of 16-32K tokens, where attention is about half a step.
LONG_TOKENS = 65536
LONG_MIN_SEQ_LEN = 16384
LONG_MAX_SEQ_LEN = 32768
# Tiny scenarios: enough tokens for several sequences of a few lengths, still milliseconds per step on a CPU.
TINY_TOKENS = 512
# Sequence lengths are drawn log-uniform in this range, like SFT chat data (many short rows, a few long ones).
MIN_SEQ_LEN = 32
MAX_SEQ_LEN = 2048
# Tiny scenarios keep the distribution's shape at their scale.
TINY_MIN_SEQ_LEN = 8
TINY_MAX_SEQ_LEN = 256
# Vision: tokens per micro-batch (Hone's train.batch_tokens, and the budget of each padded reference batch): a
# dozen or more of the generated rows, which run a few hundred tokens each (an image is 256 of them).
VISION_TOKENS = 8192


@dataclass(frozen=True)
class Scenario:
    """One benchmark case.

    Attributes:
        name: what `hone bench NAME` takes.
        shape: a key of `hone.core.models.shapes.SHAPES` (text); a vision family of `hone.core.vision` (vision).
        layers: decoder (text) layers to build (None = all of the shape's).
        tokens: default tokens in the packed row (text); tokens per micro-batch (vision).
        min_len / max_len: default range of the log-uniform sequence lengths (text; 0 for vision, whose rows
            come from generated data).
        description: one line for `hone bench --list`.
        kind: "text" (`hone.core.bench.run`), "vision" (`hone.core.bench.vision`), "preference"
            (`hone.core.bench.preference`) or "sampling" (`hone.core.bench.sampling`).
    """

    name: str
    shape: str
    layers: int | None
    tokens: int
    min_len: int
    max_len: int
    description: str
    kind: str = "text"

    @property
    def is_tiny(self) -> bool:
        return self.name.startswith("tiny-")


def _real(name: str, shape: str, layers: int | None, tokens: int, description: str) -> Scenario:
    return Scenario(name, shape, layers, tokens, MIN_SEQ_LEN, MAX_SEQ_LEN, description)


def _tiny(name: str, shape: str, description: str) -> Scenario:
    return Scenario(name, shape, None, TINY_TOKENS, TINY_MIN_SEQ_LEN, TINY_MAX_SEQ_LEN, description)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _real("dense-0.6b", "dense-0.6b", None, DENSE_TOKENS, "Qwen3-0.6B shape, all 28 layers"),
        _real("dense-4b", "dense-4b", None, DENSE_TOKENS, "Qwen3-4B shape, all 36 layers"),
        _real("dense-8b", "dense-8b", None, DENSE_TOKENS, "Qwen3-8B shape, all 36 layers"),
        Scenario(
            "dense-0.6b-long",
            "dense-0.6b",
            None,
            LONG_TOKENS,
            LONG_MIN_SEQ_LEN,
            LONG_MAX_SEQ_LEN,
            "Qwen3-0.6B shape, all 28 layers, 64K tokens in rows of 16-32K",
        ),
        Scenario(
            "dense-8b-long",
            "dense-8b",
            None,
            LONG_TOKENS,
            LONG_MIN_SEQ_LEN,
            LONG_MAX_SEQ_LEN,
            "Qwen3-8B shape, all 36 layers, 64K tokens in rows of 16-32K",
        ),
        _real(
            "dense-32b",
            "dense-32b",
            None,
            DENSE_TOKENS,
            "Qwen3-32B shape, all 64 layers (several GPUs: --gpus N --parallel fsdp; one GPU: --qlora)",
        ),
        _real("llama-1b", "llama-1b", None, DENSE_TOKENS, "Llama-3.2-1B shape, all 16 layers"),
        _real("llama-8b", "llama-8b", None, DENSE_TOKENS, "Llama-3.1-8B shape, all 32 layers"),
        # 8 of Qwen3-30B-A3B's 48 layers: the per-layer work is what is measured, and 8 layers fit beside the
        # reference's dense-mask attention and W + BA expert weights on one GPU.
        _real("moe-qwen3", "moe-qwen3", 8, MOE_TOKENS, "Qwen3-30B-A3B shape, 8 of 48 layers"),
        # 4 of gpt-oss-20b's 24 layers: two sliding-window and two full-attention layers.
        _real("moe-gptoss", "moe-gptoss", 4, MOE_TOKENS, "gpt-oss-20b shape, 4 of 24 layers"),
        # 8 of GLM-4.7-Flash's 47 layers (its dense first layer and 7 MoE layers, MLA attention in each).
        _real("moe-glm47-flash", "moe-glm47-flash", 8, MOE_TOKENS, "GLM-4.7-Flash shape, 8 of 47 layers"),
        # 5 of DeepSeek-V3's 61 layers: its 3 dense layers and 2 MoE layers (22.5 GiB of bf16 experts each).
        _real("moe-deepseek-v3", "moe-deepseek-v3", 5, MOE_TOKENS, "DeepSeek-V3 shape, 5 of 61 layers"),
        _tiny("tiny-dense", "tiny-dense", "tiny Qwen3 (CPU smoke run)"),
        _tiny("tiny-llama", "tiny-llama", "tiny Llama (CPU smoke run)"),
        _tiny("tiny-moe-qwen3", "tiny-moe-qwen3", "tiny Qwen3-MoE (CPU smoke run)"),
        _tiny("tiny-moe-gptoss", "tiny-moe-gptoss", "tiny gpt-oss (CPU smoke run)"),
        # Preference (DPO) scenarios: Hone's Trainer against TRL's DPOTrainer on generated pairs; min/max_len are
        # the words of each prompt and answer (hone.core.bench.preference).
        Scenario(
            "tiny-dpo",
            "tiny-dense",
            None,
            1024,
            4,
            64,
            "tiny Qwen3, DPO on generated pairs: Hone's Trainer vs TRL's DPOTrainer with peft (CPU smoke run)",
            kind="preference",
        ),
        Scenario(
            "dpo-8b",
            "dense-8b",
            None,
            DENSE_TOKENS,
            16,
            512,
            "Qwen3-8B shape, all 36 layers, DPO on 16K tokens of generated pairs a step: Hone's Trainer vs "
            "TRL's DPOTrainer with peft (CUDA only)",
            kind="preference",
        ),
        # GRPO's sampling (hone.core.bench.sampling): 8 prompts x 8 answers; tokens = the answer length, min/max_len
        # the prompts' tokens.
        Scenario(
            "tiny-grpo",
            "tiny-dense",
            None,
            32,
            8,
            32,
            "tiny Qwen3, GRPO's sampling: Hone's static-cache sampler vs transformers' generate (CPU smoke run)",
            kind="sampling",
        ),
        Scenario(
            "grpo-0.6b",
            "dense-0.6b",
            None,
            512,
            64,
            256,
            "Qwen3-0.6B shape, GRPO's sampling of 64 answers of 512 tokens: Hone's static-cache sampler "
            "(CUDA graph) vs transformers' generate with the same LoRA (CUDA only)",
            kind="sampling",
        ),
        Scenario(
            "grpo-8b",
            "dense-8b",
            None,
            512,
            64,
            256,
            "Qwen3-8B shape, GRPO's sampling of 64 answers of 512 tokens: Hone's static-cache sampler "
            "(CUDA graph) vs transformers' generate with the same LoRA (CUDA only)",
            kind="sampling",
        ),
        Scenario(
            "vision-qwen2.5-vl",
            "qwen2_5_vl",
            36,
            VISION_TOKENS,
            0,
            0,
            "Qwen2.5-VL-3B shape, all 36 text layers; "
            "text-only and 448 px image rows, Hone's Trainer vs padded batches (CUDA only)",
            kind="vision",
        ),
        Scenario(
            "vision-smolvlm",
            "idefics3",
            24,
            VISION_TOKENS,
            0,
            0,
            "SmolVLM-Instruct (2.2B) shape, all 24 text "
            "layers; text-only and 384 px image rows, Hone's Trainer vs padded batches (CUDA only)",
            kind="vision",
        ),
    )
}


def check_sizes(steps: int, warmup: int, lora_r: int, layers: int | None) -> None:
    """The sizes every scenario takes from the command line, or a ConfigError naming the flag to change."""
    if steps < 1 or warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0", "e.g. --steps 5 --warmup 2")
    if lora_r < 1:
        raise ConfigError(f"--lora-r is {lora_r}", "give a rank >= 1")
    if layers is not None and layers < 1:
        raise ConfigError(f"--layers is {layers}", "give at least 1 layer")


def get_scenario(name: str) -> Scenario:
    """The scenario called `name`, or a ConfigError listing the ones there are."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(f"there is no benchmark scenario {name!r}", f"pick one of: {', '.join(SCENARIOS)}") from None

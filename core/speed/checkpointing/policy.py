"""Which activation-checkpoint mode a run uses (`speed.checkpoint`), and the cost model behind `auto`.

`auto` compares, per token, the time to copy one decoder layer's saved input back from pinned host memory with the
time to recompute that layer and back-propagate through it (`LayerCost`): offloading pays when the copy is a small
share of the recompute, so double buffering hides it and even one buffer costs little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hone.core.model_info import EXPERT_COUNT_KEYS, EXPERTS_PER_TOKEN_KEYS, attention_head_dim, config_value

# What pinned host-to-device copies sustain over a PCIe 5 link, below its nominal rate (docs/performance/memory.md).
# `auto` uses it only through the copy / recompute ratio: a slower link, or a faster GPU than `LAYER_FLOPS_PER_S`
# describes, makes offloading cost more than estimated.
H2D_BYTES_PER_S = 55e9
# The rate at which a decoder layer's recompute and backward get through the FLOPs `LayerCost.recompute_flops` counts
# on a current data-centre GPU. A layer mixes GEMMs with attention and memory-bound elementwise work, so it runs well
# below the GPU's bf16 matmul peak. About half that peak is a fair estimate: a little below the rate of counted matmul
# work a whole fused dense LoRA step sustains (docs/performance/memory.md, dense.md). A lower value makes the recompute
# look longer, so `auto` starts offloading at shorter rows.
LAYER_FLOPS_PER_S = 400e12
# `auto` offloads only when reloading a layer's input takes at most this share of the layer's recompute: two buffers
# hide the copy, but it still competes for memory bandwidth, the first layer's reload is never hidden, and when
# memory gets tight the run falls back to one buffer, where the exposed copy adds up to this share to each layer's
# recompute. A step estimated a little under the cap ran as fast with offload-double as with recompute from inputs
# kept on the GPU, at less memory (docs/performance/memory.md, "Checkpoint modes and `auto`").
MAX_COPY_RATIO = 0.25
# ...and keeps one reload buffer, not two, when the copy is at most this share of the recompute: exposed, it costs
# at most 1 % of the step, and the second buffer is a whole layer input (3.1 GiB of Qwen3-8B at 409,600 tokens, where
# the copy is 0.5 % of a layer's recompute). On Qwen3-8B, from rows of ~180K tokens.
SINGLE_BUFFER_RATIO = 0.01


@dataclass(frozen=True)
class LayerCost:
    """What one decoder layer costs per token, for the copy / compute ratio.

    Attributes:
        hidden_size: H; a saved layer input is H values per token.
        linear_params: weights one token passes through in one layer (attention projections, the MLP, or the
            active experts and router of an MoE layer).
        attention_width: query heads x head dimension.
        bytes_per_value: bytes of one saved value (bf16 / fp16: 2).
    """

    hidden_size: int
    linear_params: int
    attention_width: int
    bytes_per_value: int = 2

    def recompute_flops(self, row_tokens: float) -> float:
        """FLOPs per token to recompute one layer and back-propagate through it with frozen (LoRA) weights.

        Linear layers: 2 FLOPs per weight forward and 2 more for the input gradient (frozen weights need no weight
        gradient; the LoRA matmuls are a rounding error). Causal attention over a row of S tokens: a token attends
        to S/2 keys on average, 2 matmuls x 2 FLOPs x S/2 x width forward, and a flash backward costs ~2.5 forwards
        (it recomputes the scores): 3.5 x 2 x S x width.
        """
        return 4.0 * self.linear_params + 7.0 * float(row_tokens) * self.attention_width

    def copy_ratio(self, row_tokens: float) -> float:
        """Reload time of a layer's input / its recompute time, at the reference copy rate and throughput."""
        copy_s = self.hidden_size * self.bytes_per_value / H2D_BYTES_PER_S
        return copy_s / (self.recompute_flops(row_tokens) / LAYER_FLOPS_PER_S)

    def min_row_tokens(self) -> int:
        """The shortest mean row length at which `copy_ratio` is at most `MAX_COPY_RATIO` (0 = any length)."""
        needed_flops = self.hidden_size * self.bytes_per_value / H2D_BYTES_PER_S * LAYER_FLOPS_PER_S / MAX_COPY_RATIO
        return max(0, math.ceil((needed_flops - 4.0 * self.linear_params) / (7.0 * self.attention_width)))


def layer_cost(config) -> LayerCost:
    """Per-token cost of one decoder layer, from a transformers config (text config for vision models)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h = int(text.hidden_size)
    heads = int(getattr(text, "num_attention_heads", 0) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = attention_head_dim(text)
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    experts = config_value(text, EXPERT_COUNT_KEYS)
    top_k = config_value(text, EXPERTS_PER_TOKEN_KEYS)
    if experts and top_k:
        expert_size = int(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)
        mlp = top_k * 3 * h * expert_size + h * experts
        shared = getattr(text, "shared_expert_intermediate_size", None) or (
            (getattr(text, "n_shared_experts", 0) or 0) * expert_size
        )
        mlp += 3 * h * int(shared or 0)
    else:
        mlp = 3 * h * int(text.intermediate_size)
    return LayerCost(hidden_size=h, linear_params=attention + mlp, attention_width=heads * head_dim)


@dataclass(frozen=True)
class ModeChoice:
    """The checkpoint mode a run uses: `reason` goes into RunStarted.speed_paths, `notice` (if any) becomes a
    Notice event at `level`."""

    mode: str
    reason: str
    notice: str = ""
    level: str = "info"


def is_integrated_gpu(device) -> bool:
    """True for a GPU that shares memory with the host (DGX Spark, Jetson): offloading there frees no memory."""
    return bool(torch.cuda.get_device_properties(torch.device(device)).is_integrated)


def choose_mode(
    requested: str, device, mean_row_tokens: float, model_config, integrated: bool | None = None
) -> ModeChoice:
    """The checkpoint mode for a run.

    `auto`: `off` on the CPU (memory is plentiful there and recompute costs a third more time); on a GPU, `gpu`
    when the mean row is too short for offloading to pay (reloading a layer's input would take more than
    `MAX_COPY_RATIO` of its recompute, see `LayerCost`) or the GPU shares memory with the host (DGX Spark:
    offloading frees nothing there); `offload` where rows are so long that the copy is at most `SINGLE_BUFFER_RATIO`
    of the recompute; else `offload-double` (which keeps one buffer if the second does not fit at run time).
    On the CPU, `offload` and `offload-double` degrade to `gpu` recompute with a warning.

    Args:
        requested: `speed.checkpoint`: auto, off, gpu, offload or offload-double.
        device: the training device ("cpu", "cuda", "cuda:1").
        mean_row_tokens: mean tokens per training row.
        model_config: the model's transformers config (for the layer's cost).
        integrated: whether the GPU is integrated; None = ask the device.
    """
    cuda = torch.device(device).type == "cuda"
    if requested == "off":
        return ModeChoice("off", "every activation stays in memory")
    if not cuda:
        if requested == "auto":
            return ModeChoice("off", "on the CPU memory is plentiful and recompute costs a third more time")
        if requested == "gpu":
            return ModeChoice("gpu", "recompute each decoder layer in backward from its saved input")
        return ModeChoice(
            "gpu",
            "recompute each decoder layer in backward (offloading needs a CUDA GPU)",
            notice=f"speed.checkpoint = {requested} needs a CUDA GPU and this run is on the CPU: "
            "decoder layers are recomputed from inputs kept in memory (gpu mode) instead",
            level="warning",
        )
    if requested != "auto":
        return ModeChoice(requested, _describe(requested))
    cost = layer_cost(model_config)
    ratio = cost.copy_ratio(mean_row_tokens)
    if ratio > MAX_COPY_RATIO:
        return ModeChoice(
            "gpu",
            f"rows average {mean_row_tokens:.0f} tokens: reloading a layer's input would take "
            f"{ratio:.0%} of its recompute (offloading pays from ~{cost.min_row_tokens()} tokens "
            f"per row for this model); recompute each decoder layer from an input kept on the GPU",
        )
    if integrated if integrated is not None else is_integrated_gpu(device):
        # "Host" memory is the same physical memory as the GPU's here: moving layer inputs there frees nothing.
        return ModeChoice(
            "gpu",
            "unified memory (the GPU shares system memory): offloading layer inputs to host "
            "memory would free nothing, so " + _describe("gpu"),
        )
    if ratio <= SINGLE_BUFFER_RATIO:
        return ModeChoice(
            "offload",
            f"reloading a layer's input takes ~{ratio:.1%} of its recompute: one reload buffer, the copy not hidden, "
            "the memory of a second buffer saved; " + _describe("offload"),
        )
    return ModeChoice(
        "offload-double",
        f"reloading a layer's input takes ~{ratio:.0%} of its recompute, hidden "
        "behind it by two buffers (one if memory is short); " + _describe("offload-double"),
    )


def _describe(mode: str) -> str:
    return {
        "gpu": "recompute each decoder layer in backward from its input kept on the GPU",
        "offload": "layer inputs in pinned host memory, reloaded into one GPU buffer before each recompute",
        "offload-double": "layer inputs in pinned host memory, the next layer's reload overlapping the current "
        "layer's recompute (two GPU buffers)",
    }[mode]

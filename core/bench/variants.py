"""The Hone runs of a benchmark, as data: each is a set of `SpeedConfig` overrides over "every path off".

`BASE` switches every speed path off (transformers' attention, full logits, recompute checkpointing, transformers'
eager experts, no fused kernels, no compilation): Hone's own loop doing what the reference does. Each variant
turns one path on (or all of them); adding a variant is adding a row. A variant that cannot run in this build or
on this device is skipped with the reason recorded: a field or value this build's `SpeedConfig` does not know, a
CUDA-only path on a CPU, a package that is not installed. A variant whose purpose is one path (`focus`) is also
skipped when the run's speed report shows the path was not wired in (see `hone_runner`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

from hone.core.config import SpeedConfig, TrainConfig
from hone.core.errors import ConfigError

BASE: dict = {"packing": True, "attention": "hf", "loss": "plain", "checkpoint": "gpu", "moe_backend": "eager",
              "kernels": False, "compile": False}
ALL_ON: dict = {"attention": "auto", "loss": "chunked", "checkpoint": "auto", "moe_backend": "auto", "kernels": True,
                "compile": False}


@dataclass(frozen=True)
class Variant:
    """One Hone run.

    Attributes:
        name: the run's name in the table and for `--only`.
        overrides: SpeedConfig fields set over `BASE`.
        description: one line for `hone bench --list` and the JSON record.
        needs: "cuda" (a CUDA device), "moe" / "dense" (only for such models), "module:NAME" (importable).
        focus: the speed paths this variant exists to measure ("attention", "loss", "checkpoint", "moe",
            "kernels", "compile"); it is skipped when the run shows one of them not wired in.
        per_layer_metadata: benchmark-only attention mode that rebuilds the packed metadata in every layer.
        train: TrainConfig fields set over the benchmark's own (e.g. the optimizer).
    """

    name: str
    overrides: dict
    description: str
    needs: tuple[str, ...] = ()
    focus: tuple[str, ...] = ()
    per_layer_metadata: bool = False
    train: dict = dataclasses.field(default_factory=dict)


VARIANTS: tuple[Variant, ...] = (
    Variant("hone-base", {}, "Hone's step with every speed path off (should match the reference)"),
    Variant("attn-varlen", {"attention": "varlen"}, "packed attention: torch varlen_attn, metadata once per batch",
            needs=("cuda",), focus=("attention",)),
    Variant("attn-varlen-per-layer", {"attention": "varlen"}, "the same, metadata rebuilt in every layer",
            needs=("cuda",), focus=("attention",), per_layer_metadata=True),
    Variant("attn-flash", {"attention": "flash"}, "packed attention: flash-attn varlen",
            needs=("cuda", "module:flash_attn"), focus=("attention",)),
    Variant("attn-sdpa", {"attention": "sdpa"}, "packed attention: SDPA with one block mask per batch",
            focus=("attention",)),
    Variant("attn-sdpa-per-layer", {"attention": "sdpa"}, "the same, block mask rebuilt in every layer",
            focus=("attention",), per_layer_metadata=True),
    Variant("loss-chunked", {"loss": "chunked"}, "chunked cross-entropy, never all logits", focus=("loss",)),
    Variant("attn+loss", {"attention": "auto", "loss": "chunked"}, "packed attention (auto) + chunked loss",
            focus=("attention",)),
    Variant("ckpt-off", {"checkpoint": "off"}, "no activation checkpointing", focus=("checkpoint",)),
    Variant("ckpt-offload", {"checkpoint": "offload"}, "checkpoints offloaded to pinned CPU memory, one buffer",
            needs=("cuda",), focus=("checkpoint",)),
    Variant("ckpt-offload-double", {"checkpoint": "offload-double"}, "offloaded checkpoints, two reload buffers",
            needs=("cuda",), focus=("checkpoint",)),
    Variant("moe-grouped_mm", {"moe_backend": "grouped_mm"}, "MoE experts: torch._grouped_mm + split LoRA",
            needs=("moe",), focus=("moe",)),
    Variant("moe-triton", {"moe_backend": "triton"}, "MoE experts: Hone's Triton grouped GEMM + split LoRA",
            needs=("moe", "cuda"), focus=("moe",)),
    Variant("moe-torch", {"moe_backend": "torch"}, "MoE experts: PyTorch loop over groups + split LoRA",
            needs=("moe",), focus=("moe",)),
    Variant("kernels", {"kernels": True}, "fused Triton kernels (norm, rope, activation, LoRA)", needs=("cuda",),
            focus=("kernels",)),
    Variant("compile", {"compile": True}, "decoder blocks compiled with torch.compile", needs=("cuda",),
            focus=("compile",)),
    Variant("all", ALL_ON, "every speed path on, as `auto` picks them (Hone's defaults, with the MLP tiled as when "
            "memory is short; with memory to spare the Trainer runs all-untiled)"),
    Variant("all-lean", ALL_ON, "every speed path on, and train.optimizer = adamw-bf16 (bf16 gradients and moments)",
            train={"optimizer": "adamw-bf16"}),
    Variant("all+compile", {**ALL_ON, "compile": True}, "every speed path on, and compiled blocks",
            needs=("cuda",), focus=("compile",)),
    # The MLP is tiled by the fused kernels, so without a GPU "untiled" is "all" again.
    Variant("all-untiled", {**ALL_ON, "tiled_mlp": False}, "every path on, MLP back-propagated whole (not in tiles)",
            needs=("cuda",), focus=("kernels",)),
    Variant("all-attn-grouped", {**ALL_ON, "grouped_attention_backward": True},
            "every path on, varlen attention back-propagated a group of whole sequences at a time", needs=("cuda",),
            focus=("attention",)),
    Variant("all-long-rows-varlen", {**ALL_ON, "long_row_attention": "off"},
            "every path on, long sequences in the same varlen call as the short ones (not through cuDNN)",
            needs=("cuda",), focus=("attention",)),
    Variant("all-long-rows-recompute", {**ALL_ON, "keep_long_row_attention": False},
            "every path on, long-row attention computed again in the checkpointed layers' backward (not kept)",
            needs=("cuda",), focus=("attention",)),
    Variant("all-offload-double-attn-grouped", {**ALL_ON, "checkpoint": "offload-double",
                                                "grouped_attention_backward": True},
            "every path on, offloaded checkpoints (two buffers), attention back-propagated in sequence groups",
            needs=("cuda",), focus=("attention",)),
    Variant("all-embed-gpu", {**ALL_ON, "host_embeddings": False},
            "every path on, the input-embedding table kept in GPU memory", needs=("cuda",)),
    Variant("all-head-gpu", {**ALL_ON, "host_lm_head": False},
            "every path on, the LM head kept in GPU memory (a tied table with it)", needs=("cuda",)),
    Variant("all-groups-4k", {**ALL_ON, "layer_group_tokens": 4096},
            "every path on, layers back-propagated in sequence groups of <= 4,096 tokens", focus=("checkpoint",)),
    Variant("all-groups-2k", {**ALL_ON, "layer_group_tokens": 2048},
            "every path on, layers back-propagated in sequence groups of <= 2,048 tokens", focus=("checkpoint",)),
    Variant("all-groups-8k", {**ALL_ON, "layer_group_tokens": 8192},
            "every path on, layers back-propagated in sequence groups of <= 8,192 tokens", focus=("checkpoint",)),
    Variant("all-ckpt-gpu", {**ALL_ON, "checkpoint": "gpu"}, "every path on, recompute checkpointing",
            focus=("checkpoint",)),
    # What the recompute costs: nothing recomputed, every activation held on the device (as much memory as it takes).
    Variant("all-ckpt-off", {**ALL_ON, "checkpoint": "off"}, "every path on, no activation checkpointing",
            focus=("checkpoint",)),
    Variant("all-offload", {**ALL_ON, "checkpoint": "offload"}, "every path on, offloaded checkpoints (one buffer)",
            needs=("cuda",), focus=("checkpoint",)),
    Variant("all-offload-double", {**ALL_ON, "checkpoint": "offload-double"},
            "every path on, offloaded checkpoints (two buffers)", needs=("cuda",), focus=("checkpoint",)),
    Variant("all-offload-double-groups-4k", {**ALL_ON, "checkpoint": "offload-double", "layer_group_tokens": 4096},
            "every path on, offloaded checkpoints (two buffers), layers back-propagated in sequence groups of "
            "<= 4,096 tokens", needs=("cuda",), focus=("checkpoint",)),
    Variant("all-offload-double-groups-8k", {**ALL_ON, "checkpoint": "offload-double", "layer_group_tokens": 8192},
            "every path on, offloaded checkpoints (two buffers), layers back-propagated in sequence groups of "
            "<= 8,192 tokens", needs=("cuda",), focus=("checkpoint",)),
)


def applies(variant: Variant, is_moe: bool) -> bool:
    """Whether the variant means anything for this model (MoE backends only for MoE models)."""
    return not (("moe" in variant.needs and not is_moe) or ("dense" in variant.needs and is_moe))


def speed_settings(variant: Variant) -> dict:
    """BASE with the variant's overrides, keeping BASE fields this build's SpeedConfig does not have."""
    fields = {f.name for f in dataclasses.fields(SpeedConfig)}
    merged = {k: v for k, v in BASE.items() if k in fields}
    merged.update(variant.overrides)
    return merged


def speed_config(variant: Variant) -> SpeedConfig:
    """The SpeedConfig of a variant; ConfigError when this build's SpeedConfig does not accept it."""
    fields = {f.name for f in dataclasses.fields(SpeedConfig)}
    unknown = sorted(set(variant.overrides) - fields)
    if unknown:
        raise ConfigError(f"SpeedConfig has no field {unknown[0]!r} in this build", "")
    return SpeedConfig(**speed_settings(variant))


def train_settings(variant: Variant) -> dict:
    """The variant's TrainConfig overrides, for the record (keys prefixed "train.")."""
    return {f"train.{k}": v for k, v in variant.train.items()}


def unavailable(variant: Variant, device: str) -> str | None:
    """Why the variant cannot run in this build or on this device, or None."""
    for need in variant.needs:
        if need == "cuda" and not str(device).startswith("cuda"):
            return "needs a CUDA GPU"
        if need.startswith("module:") and importlib.util.find_spec(need.removeprefix("module:")) is None:
            return f"the {need.removeprefix('module:')} package is not installed"
    try:
        speed_config(variant)
    except ConfigError as e:
        return f"this build's speed settings do not accept it: {e.message}"
    train_fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for key, value in variant.train.items():
        choices = train_fields[key].metadata.get("choices") if key in train_fields else None
        if key not in train_fields or (choices and value not in choices):
            return f"this build's train settings do not accept train.{key} = {value!r}"
    return None


def variant_table() -> list[dict]:
    """Rows for `hone bench --list`."""
    return [{"name": v.name, "description": v.description, "overrides": {**v.overrides, **train_settings(v)},
             "needs": list(v.needs)} for v in VARIANTS]

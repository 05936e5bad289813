"""The Hone runs of a benchmark, as data: each is a set of `SpeedConfig` overrides over "every path off".

`BASE` switches every speed path off (transformers' attention, full logits, recompute checkpointing, transformers'
eager experts, no fused kernels, no compilation): Hone's own loop doing what the reference does. `VARIANTS` holds
the runs a user chooses between: each path turned on alone, every path on (`all`, Hone's defaults) and the
defaults the README weighs against another choice. Any other combination is a run of the user's own, given as
`hone bench --run NAME=RUN,SETTING=VALUE,...` (`custom_variant`); docs/performance/experiments.md has the ones
the performance pages measured (layer-group sizes, offloaded checkpoints with them, memory levers off, ...).

A variant that cannot run in this build or on this device is skipped with the reason recorded: a field or value
this build's `SpeedConfig` does not know, a CUDA-only path on a CPU, a package that is not installed. A variant
whose purpose is one path (`focus`) is also skipped when the run's speed report shows the path was not wired in
(see `hone_runner`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

from hone.core.config import SpeedConfig, TrainConfig
from hone.core.errors import ConfigError

BASE: dict = {
    "packing": True,
    "attention": "hf",
    "loss": "plain",
    "checkpoint": "gpu",
    "moe_backend": "eager",
    "kernels": False,
    "compile": False,
    "keep_layer_activations": 0,
}
ALL_ON: dict = {
    "attention": "auto",
    "loss": "chunked",
    "checkpoint": "auto",
    "moe_backend": "auto",
    "kernels": True,
    "compile": False,
}


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
    Variant(
        "attn-varlen",
        {"attention": "varlen"},
        "packed attention: torch varlen_attn, metadata once per batch",
        needs=("cuda",),
        focus=("attention",),
    ),
    Variant(
        "attn-flash",
        {"attention": "flash"},
        "packed attention: flash-attn varlen",
        needs=("cuda", "module:flash_attn"),
        focus=("attention",),
    ),
    Variant(
        "attn-sdpa", {"attention": "sdpa"}, "packed attention: SDPA with one block mask per batch", focus=("attention",)
    ),
    Variant("loss-chunked", {"loss": "chunked"}, "chunked cross-entropy, never all logits", focus=("loss",)),
    Variant("ckpt-off", {"checkpoint": "off"}, "no activation checkpointing", focus=("checkpoint",)),
    Variant(
        "ckpt-offload",
        {"checkpoint": "offload"},
        "checkpoints offloaded to pinned CPU memory, one buffer",
        needs=("cuda",),
        focus=("checkpoint",),
    ),
    Variant(
        "ckpt-offload-double",
        {"checkpoint": "offload-double"},
        "offloaded checkpoints, two reload buffers",
        needs=("cuda",),
        focus=("checkpoint",),
    ),
    Variant(
        "moe-grouped_mm",
        {"moe_backend": "grouped_mm"},
        "MoE experts: torch._grouped_mm + split LoRA",
        needs=("moe",),
        focus=("moe",),
    ),
    Variant(
        "moe-triton",
        {"moe_backend": "triton"},
        "MoE experts: Hone's Triton grouped GEMM + split LoRA",
        needs=("moe", "cuda"),
        focus=("moe",),
    ),
    Variant(
        "moe-torch",
        {"moe_backend": "torch"},
        "MoE experts: PyTorch loop over groups + split LoRA",
        needs=("moe",),
        focus=("moe",),
    ),
    Variant(
        "kernels",
        {"kernels": True},
        "fused Triton kernels (norm, rope, activation, LoRA)",
        needs=("cuda",),
        focus=("kernels",),
    ),
    Variant(
        "compile", {"compile": True}, "decoder blocks compiled with torch.compile", needs=("cuda",), focus=("compile",)
    ),
    Variant(
        "all",
        ALL_ON,
        "every speed path on, as `auto` picks them (Hone's defaults as when memory is short: the MLP tiled and "
        "every layer recomputed; with memory to spare the Trainer does neither: all-spare)",
    ),
    Variant(
        "all-spare",
        {**ALL_ON, "keep_layer_activations": -1},
        "every speed path on, as the Trainer runs them with memory to spare: whole MLPs where that step takes at "
        "most half of the free memory (or --memory-cap), and as many of the last layers keeping their activations "
        "instead of being recomputed as the rest of it holds",
        needs=("cuda",),
    ),
    Variant(
        "all-graphs-off",
        {**ALL_ON, "cuda_graphs": "off"},
        "every speed path on, the micro-batches run eagerly instead of replayed as CUDA graphs",
        needs=("cuda",),
    ),
    Variant(
        "all-lean",
        ALL_ON,
        "every speed path on, and train.optimizer = adamw-bf16 (bf16 gradients and moments)",
        train={"optimizer": "adamw-bf16"},
    ),
    Variant(
        "all-long-rows-recompute",
        {**ALL_ON, "keep_long_row_attention": False},
        "every path on, long-row attention computed again in the checkpointed layers' backward (not kept)",
        needs=("cuda",),
        focus=("attention",),
    ),
    # What the recompute costs: nothing recomputed, every activation held on the device (as much memory as it takes).
    Variant(
        "all-ckpt-off",
        {**ALL_ON, "checkpoint": "off"},
        "every path on, no activation checkpointing",
        focus=("checkpoint",),
    ),
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
    return [
        {
            "name": v.name,
            "description": v.description,
            "overrides": {**v.overrides, **train_settings(v)},
            "needs": list(v.needs),
        }
        for v in VARIANTS
    ]


# ---- runs of the user's own: `hone bench --run NAME=RUN,SETTING=VALUE,...` ----

RUN_EXAMPLE = "--run all-groups-4k=all,speed.layer_group_tokens=4096"
OTHER_RUNS = ("reference", "reference-eager", "unsloth")  # the runs of a benchmark that are not Hone's
BENCH_SETTINGS = ("per_layer_metadata",)  # bench.X: benchmark-only modes, not in any config
# The speed path each SpeedConfig field belongs to: a --run run that changes the field measures that path (its
# `focus`), so it is skipped when the run shows the path not wired in rather than reported as a copy of its start.
PATH_OF_FIELD = {
    "attention": "attention",
    "long_row_attention": "attention",
    "keep_long_row_attention": "attention",
    "grouped_attention_backward": "attention",
    "loss": "loss",
    "checkpoint": "checkpoint",
    "layer_group_tokens": "checkpoint",
    "keep_layer_activations": "checkpoint",
    "moe_backend": "moe",
    "kernels": "kernels",
    "tiled_mlp": "kernels",
    "compile": "compile",
}


def custom_variant(spec: str, taken: set[str] | frozenset[str] = frozenset()) -> Variant:
    """The run `--run spec` describes: NAME=RUN,SETTING=VALUE,... is the listed Hone run RUN with each SETTING
    changed, shown as NAME. A SETTING is speed.FIELD or train.FIELD (as `hone train --set` takes them) or
    bench.per_layer_metadata. `taken`: names already in the benchmark besides the listed runs.

    Raises:
        ConfigError: the spec is not of that form, RUN is not a listed run, NAME is taken, a setting is unknown or
            its value is not one the config accepts.
    """
    name, _, rest = (part.strip() for part in spec.partition("="))
    start_name, *assignments = (item.strip() for item in rest.split(","))
    if not name or not start_name or "=" in start_name or any(c in name for c in ",= *?["):
        raise ConfigError(f"--run {spec!r} is not of the form NAME=RUN,SETTING=VALUE,...", f"write e.g. {RUN_EXAMPLE}")
    listed = {v.name: v for v in VARIANTS}
    if name in listed or name in taken or name in OTHER_RUNS:
        raise ConfigError(f"--run {spec!r}: {name!r} is already a run of this benchmark", "give the run another name")
    if start_name not in listed:
        raise ConfigError(
            f"--run {spec!r}: {start_name!r} is not a Hone run to start from",
            f"start from one of: {', '.join(listed)}",
        )
    start = listed[start_name]
    sections: dict[str, dict[str, str]] = {"speed": {}, "train": {}, "bench": {}}
    for assignment in assignments:
        key, sep, value = (part.strip() for part in assignment.partition("="))
        section, _, field_name = key.partition(".")
        if not sep or section not in sections or not field_name:
            raise ConfigError(
                f"--run {spec!r}: {assignment!r} is not a setting",
                "give speed.FIELD=VALUE, train.FIELD=VALUE or bench.per_layer_metadata=true, e.g. "
                "speed.checkpoint=offload",
            )
        if field_name in sections[section]:
            raise ConfigError(f"--run {spec!r}: {key} is given twice", "keep the one you mean")
        sections[section][field_name] = value
    speed = _changes(spec, "speed", SpeedConfig, speed_settings(start), sections["speed"])
    train = _changes(spec, "train", TrainConfig, start.train, sections["train"])
    per_layer_metadata = _bench_changes(spec, start, sections["bench"])
    changes = [f"speed.{k} = {_shown(v)}" for k, v in speed.items()] + [f"train.{k} = {v}" for k, v in train.items()]
    if per_layer_metadata != start.per_layer_metadata:
        changes.append(f"bench.per_layer_metadata = {str(per_layer_metadata).lower()}")
    return Variant(
        name,
        {**start.overrides, **speed},
        f"{start.name}, with {', '.join(changes)}" if changes else f"{start.name} again",
        needs=tuple(dict.fromkeys((*start.needs, *_needs_of(speed)))),
        focus=tuple(dict.fromkeys((*start.focus, *(PATH_OF_FIELD[k] for k in speed if k in PATH_OF_FIELD)))),
        per_layer_metadata=per_layer_metadata,
        train={**start.train, **train},
    )


def bench_variants(specs: list[str] | tuple[str, ...] | None = None) -> tuple[Variant, ...]:
    """The listed Hone runs, then those `--run` gives (`specs`, in order).

    Raises:
        ConfigError: a spec `custom_variant` refuses, or two with the same name.
    """
    extra: list[Variant] = []
    for spec in specs or ():
        extra.append(custom_variant(spec, taken={v.name for v in extra}))
    return (*VARIANTS, *extra)


def _changes(spec: str, section: str, cls: type, start: dict, given: dict[str, str]) -> dict:
    """The `section` settings `given` (text), as the values `cls` (SpeedConfig, TrainConfig) makes of them over
    `start`'s."""
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in given:
        if key not in fields:
            raise ConfigError(
                f"--run {spec!r}: {section}.{key} is not a {section} setting",
                f"{section} settings are {', '.join(sorted(fields))}",
            )
    try:
        config = cls(**{**start, **given})
    except ConfigError as e:
        raise ConfigError(f"--run {spec!r}: {e.message}", e.advice) from None
    return {key: getattr(config, key) for key in given}


def _bench_changes(spec: str, start: Variant, given: dict[str, str]) -> bool:
    """bench.per_layer_metadata as `given` (true or false), else `start`'s."""
    for key, value in given.items():
        if key not in BENCH_SETTINGS:
            raise ConfigError(
                f"--run {spec!r}: bench.{key} is not a benchmark setting",
                f"the benchmark's own settings are {', '.join('bench.' + s for s in BENCH_SETTINGS)}",
            )
        if value.lower() not in ("true", "false"):
            raise ConfigError(f"--run {spec!r}: bench.{key} is {value!r}", f"set bench.{key} to true or false")
    value = given.get("per_layer_metadata")
    return start.per_layer_metadata if value is None else value.lower() == "true"


def _shown(value) -> str:
    """A setting's value as a config file writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _needs_of(speed: dict) -> tuple[str, ...]:
    """What changed speed settings need: "cuda" for a path that exists only on a CUDA GPU (on a CPU the run would
    measure its starting run again), the flash-attn package for flash attention, an MoE model for an experts
    backend."""
    needs = []
    if "moe_backend" in speed:
        needs.append("moe")
    if speed.get("attention") == "flash":
        needs.append("module:flash_attn")
    gpu_only = (
        speed.get("attention") in ("varlen", "flash")
        or str(speed.get("checkpoint", "")).startswith("offload")
        or speed.get("moe_backend") == "triton"
        or any(speed.get(k) is True for k in ("kernels", "compile", "grouped_attention_backward"))
        or any(speed.get(k) is False for k in ("host_embeddings", "host_lm_head"))
        or any(k in speed for k in ("tiled_mlp", "long_row_attention", "keep_long_row_attention"))
    )
    return (*needs, "cuda") if gpu_only else tuple(needs)

"""The model every run starts from: a random-init model of the scenario's shape, identical for every run.

`build_bench_model` builds it straight onto the device (same seed, same device -> same weights). QLoRA runs need
a folder that `from_pretrained` can quantize while loading, as users load theirs: `saved_model_folder` writes the
same random-init weights there once, with a tokenizer over a synthetic vocabulary of the model's size (the
benchmark feeds token ids directly; the loaders only need one to exist).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import torch

from hone.core.bench.scenarios import Scenario
from hone.core.model_info import ModelInfo
from hone.core.models.load import count_params, info_from_config, logical_numel
from hone.core.models.shapes import SHAPES, build_model, make_config

# Written last into a saved model folder: a folder without it is a half-written one and is rebuilt.
_COMPLETE_MARKER = "hone_bench_complete"


def vocab_size(scenario: Scenario) -> int:
    return int(SHAPES[scenario.shape].kwargs["vocab_size"])


def layer_count(scenario: Scenario, layers: int | None) -> int | None:
    """Layers to build: the option, else the scenario's default (None = all of the shape's)."""
    return layers if layers is not None else scenario.layers


def default_attention(scenario: Scenario) -> str:
    """The attention a careful user loads the model with: SDPA, or eager where transformers has no SDPA path
    for the architecture (gpt-oss: its attention sinks)."""
    from transformers import AutoModelForCausalLM

    config = make_config(scenario.shape, 1)
    model_class = AutoModelForCausalLM._model_mapping[type(config)]
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def build_bench_model(
    scenario: Scenario,
    layers: int | None,
    *,
    seed: int,
    dtype: torch.dtype,
    device: str,
    attn_implementation: str | None = None,
    experts_implementation: str | None = None,
):
    """The scenario's random-init causal LM on `device`, in `dtype`, in training mode.

    `attn_implementation` None = `default_attention(scenario)`, the same for every run.
    """
    extra = {"attn_implementation": attn_implementation or default_attention(scenario)}
    if experts_implementation is not None:
        extra["experts_implementation"] = experts_implementation
    model = build_model(scenario.shape, layer_count(scenario, layers), seed=seed, dtype=dtype, device=device, **extra)
    model.config.use_cache = False
    model.train()
    return model


def bench_model_info(model, scenario: Scenario) -> ModelInfo:
    """What the trainer's `load_model` would report for this model."""
    return info_from_config(model.config, scenario.name, "shape", count_params(model))


def architecture_facts(scenario: Scenario, layers: int | None) -> dict:
    """Attention geometry and depth of the scenario, from its config alone (no weights)."""
    config = make_config(scenario.shape, layer_count(scenario, layers))
    heads = config.num_attention_heads
    return {
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "sliding_window": getattr(config, "sliding_window", None),
        "experts": next(
            (getattr(config, k) for k in ("num_experts", "num_local_experts") if getattr(config, k, None)), 0
        ),
        "experts_per_token": getattr(config, "num_experts_per_tok", 0) or 0,
    }


def is_expert_parameter(name: str) -> bool:
    """Whether a parameter belongs to routed experts (a token passes through top-k of them, not all)."""
    return ".experts." in f".{name}."


def active_params(model, experts: int, experts_per_token: int) -> int:
    """Parameters one token passes through: all of them, routed-expert ones (and their LoRA) scaled by top-k / E.

    Embedding and LM head count (tied ones once), LoRA adapters count; 4-bit weights count unpacked.
    """
    share = experts_per_token / experts if experts else 1.0
    total = 0.0
    for name, p in model.named_parameters():
        n = logical_numel(p)
        total += n * share if experts and is_expert_parameter(name) else n
    return int(total)


def decoder_linear_names(model) -> list[str]:
    """Names (last part) of the decoder layers' linear modules, e.g. ["down_proj", ..., "v_proj"]: LoRA on the
    linear layers only. On MoE models in transformers 5 neither stacked experts nor routers are nn.Linear."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ".layers." in name
        }
    )


def adapted_names(model) -> list[str]:
    """What a peft model has LoRA on, by last name part: modules ("q_proj") and 3-D expert parameters
    ("experts.gate_up_proj"), sorted. Two runs that adapt different sets are not the same run."""
    names = set()
    for name, module in model.named_modules():
        if not hasattr(module, "lora_A") or name.endswith(("lora_A", "lora_B")):
            continue
        parameter = getattr(module, "parameter_name", None)  # peft's wrapper of a 3-D expert weight
        inner = name.removesuffix(".base_layer").rsplit(".", 1)[-1]
        names.add(f"{inner}.{parameter}" if parameter else inner)
    return sorted(names)


def expert_target_parameters(model) -> list[str]:
    """peft `target_parameters` entries for every stacked (3-D) expert weight, e.g. "mlp.experts.gate_up_proj".

    peft matches them as name suffixes; the layer prefix ("model.layers.3.") is cut off.
    """
    targets: list[str] = []
    for name, p in model.named_parameters():
        if p.ndim == 3 and is_expert_parameter(name):
            tail = re.split(r"(?:^|\.)\d+\.", name)[-1]
            if tail not in targets:
                targets.append(tail)
    return targets


def synthetic_tokenizer(vocab: int):
    """A word-level tokenizer whose tokens are "<0>" .. "<vocab-1>", id i for "<i>"; pad = "<0>", eos = "<1>"."""
    import tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = tokenizers.Tokenizer(WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<0>", pad_token="<0>", eos_token="<1>")


def saved_model_folder(
    scenario: Scenario, layers: int | None, *, seed: int, dtype: torch.dtype, device: str, cache_dir: str | Path | None
) -> Path:
    """A folder holding the scenario's random-init weights (as `build_bench_model` makes them) and a tokenizer.

    With `cache_dir` the folder is kept there and reused by later benchmarks with the same key; without, it is
    a new temporary folder the caller removes (`remove_folder`).
    """
    key = (
        f"{scenario.shape}-layers{layer_count(scenario, layers) or 'all'}-seed{seed}-"
        f"{str(dtype).removeprefix('torch.')}-{torch.device(device).type}"
    )
    if cache_dir is not None:
        folder = Path(cache_dir) / key
        if (folder / _COMPLETE_MARKER).is_file():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix=f"hone-bench-{key}-"))
    model = build_bench_model(scenario, layers, seed=seed, dtype=dtype, device=device)
    model.save_pretrained(folder)
    del model
    synthetic_tokenizer(vocab_size(scenario)).save_pretrained(folder)
    (folder / _COMPLETE_MARKER).write_text("ok\n")
    return folder


def remove_folder(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)

"""Train-page presets: named sets of RunConfig overrides (the same `section.key=value` strings as `--set`).

A preset changes only the settings it names; the model, data, output and training method stay as they are. For a
run that learns from preferences (DPO, SimPO, ORPO, KTO) or rewards (GRPO) a preset also sets what those methods
need (a learning rate ten to forty times lower than supervised fine-tuning's, the preference strength β), so the
same presets serve every method. For a given method every preset names the same settings, so the result of a
preset never depends on which one was applied before. "CPU quick test" is offered only on a computer without an NVIDIA
GPU (`presets_for`), "Laptop 8 GB" everywhere (on a CPU the Train page says what it needs).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from hone.core.config import RunConfig
from hone.core.errors import ConfigError

# What a preset sets besides its own overrides, per training method family: learning from preferences or rewards
# moves the model away from where supervised fine-tuning left it, and takes far smaller steps (common LoRA recipes:
# DPO about 5e-6, GRPO about 5e-6); β = 0.1 is the usual preference strength.
PREFERENCE_SETTINGS = ("train.lr=5e-6", "preference.beta=0.1")
GRPO_SETTINGS = ("train.lr=5e-6", "grpo.beta=0.0")
PREFERENCE_FAMILY = ("dpo", "simpo", "orpo", "kto")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    overrides: tuple[str, ...]
    cpu_only: bool = False  # sized for a computer without an NVIDIA GPU: offered there only

    def overrides_for(self, method: str) -> tuple[str, ...]:
        """The preset's settings for a run of training method `method` (the later ones win)."""
        if method in PREFERENCE_FAMILY:
            return (*self.overrides, *PREFERENCE_SETTINGS)
        if method == "grpo":
            return (*self.overrides, *GRPO_SETTINGS)
        return self.overrides

    def apply(self, config: RunConfig) -> RunConfig:
        return config.with_overrides(list(self.overrides_for(config.train.method)))


PRESETS: tuple[Preset, ...] = (
    Preset(
        "Quick test",
        "A few dozen steps on short rows to check that everything works end to end.",
        (
            "train.max_steps=30",
            "train.epochs=1.0",
            "train.batch_tokens=2048",
            "train.grad_accum=1",
            "train.lr=2e-4",
            'train.optimizer="adamw"',
            "train.eval_every=0",
            "data.max_length=512",
            "data.eval_fraction=0.0",
            "lora.r=8",
            "lora.alpha=16.0",
            "lora.rslora=false",
            "lora.qlora=false",
            'speed.checkpoint="off"',
            "output.checkpoint_every=0",
        ),
    ),
    Preset(
        "Laptop 8 GB",
        "Fits 7-8B models on an 8 GB GPU: 4-bit base, 8-bit optimizer, offloaded activations.",
        (
            "train.max_steps=0",
            "train.epochs=1.0",
            "train.batch_tokens=4096",
            "train.grad_accum=4",
            "train.lr=2e-4",
            'train.optimizer="adamw8bit"',
            "train.eval_every=0",
            "data.max_length=2048",
            "data.eval_fraction=0.0",
            "lora.r=16",
            "lora.alpha=32.0",
            "lora.rslora=false",
            "lora.qlora=true",
            'speed.checkpoint="offload"',
            "output.checkpoint_every=200",
        ),
    ),
    Preset(
        "Balanced",
        "Sensible defaults for a workstation GPU: one epoch, rank 16, automatic speed paths.",
        (
            "train.max_steps=0",
            "train.epochs=1.0",
            "train.batch_tokens=8192",
            "train.grad_accum=1",
            "train.lr=2e-4",
            'train.optimizer="adamw"',
            "train.eval_every=0",
            "data.max_length=2048",
            "data.eval_fraction=0.0",
            "lora.r=16",
            "lora.alpha=32.0",
            "lora.rslora=false",
            "lora.qlora=false",
            'speed.checkpoint="auto"',
            "output.checkpoint_every=500",
        ),
    ),
    Preset(
        "Max quality",
        "Higher rank with rsLoRA, three epochs, a held-out eval split scored as it trains.",
        (
            "train.max_steps=0",
            "train.epochs=3.0",
            "train.batch_tokens=16384",
            "train.grad_accum=2",
            "train.lr=1e-4",
            'train.optimizer="adamw"',
            "train.eval_every=100",
            "data.max_length=4096",
            "data.eval_fraction=0.05",
            "lora.r=64",
            "lora.alpha=64.0",
            "lora.rslora=true",
            "lora.qlora=false",
            'speed.checkpoint="auto"',
            "output.checkpoint_every=500",
        ),
    ),
    # A CPU trains a small model at tens of tokens per second: Quick test's 61,440 tokens took 20-45 minutes on a
    # two-core laptop (issue 43). A twelfth of them, on rows of at most 256 tokens, checks the run end to end in
    # minutes; rank 4 keeps the adapter's own work small, and without activation checkpointing no layer runs twice.
    Preset(
        "CPU quick test",
        "Ten short steps sized for a computer without a GPU: checks that everything works in a few minutes.",
        (
            "train.max_steps=10",
            "train.epochs=1.0",
            "train.batch_tokens=512",
            "train.grad_accum=1",
            "train.lr=2e-4",
            'train.optimizer="adamw"',
            "train.eval_every=0",
            "data.max_length=256",
            "data.eval_fraction=0.0",
            "lora.r=4",
            "lora.alpha=8.0",
            "lora.rslora=false",
            "lora.qlora=false",
            'speed.checkpoint="off"',
            "output.checkpoint_every=0",
        ),
        cpu_only=True,
    ),
)
CPU_PRESET = "CPU quick test"

PRESETS_BY_NAME = {preset.name: preset for preset in PRESETS}


def presets_for(*, has_gpu: bool) -> tuple[Preset, ...]:
    """The presets offered on a machine with or without an NVIDIA GPU."""
    return tuple(preset for preset in PRESETS if not has_gpu or not preset.cpu_only)


def matching_preset(config: RunConfig) -> str:
    """The name of the preset whose every override the config already has, or '' (the user edited it)."""
    values = config.to_dict()
    for preset in PRESETS:
        targets = _targets(preset.name, config.train.method)
        if targets is None:  # the preset does not apply to the defaults alone: apply it to this config
            if preset.apply(config).to_dict() == values:
                return preset.name
        elif all(values[section][name] == value for (section, name), value in targets.items()):
            return preset.name
    return ""


@functools.cache
def _targets(name: str, method: str) -> dict[tuple[str, str], Any] | None:
    """The values a preset sets for a run of `method`, as its config checks them (built once: the Train page asks on
    every refresh); None when the preset cannot be applied to the defaults alone."""
    preset = PRESETS_BY_NAME[name]
    try:
        applied = preset.apply(RunConfig().with_overrides([f"train.method={json.dumps(method)}"])).to_dict()
    except ConfigError:
        return None
    keys = [assignment.partition("=")[0].strip().partition(".") for assignment in preset.overrides_for(method)]
    return {(section, name): applied[section][name] for section, _dot, name in keys}

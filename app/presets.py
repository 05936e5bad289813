"""Train-page presets: named sets of RunConfig overrides (the same `section.key=value` strings as `--set`).

A preset changes only the settings it names; the model, data and output choices stay as they are. Every preset
names the same settings (`PRESET_KEYS`), so the result of a preset never depends on which one was applied before.
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.core.config import RunConfig


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    overrides: tuple[str, ...]

    def apply(self, config: RunConfig) -> RunConfig:
        return config.with_overrides(list(self.overrides))


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
)

PRESETS_BY_NAME = {preset.name: preset for preset in PRESETS}
PRESET_KEYS = frozenset(o.partition("=")[0] for preset in PRESETS for o in preset.overrides)


def matching_preset(config: RunConfig) -> str:
    """The name of the preset whose every override the config already has, or '' (the user edited it)."""
    values = config.to_dict()
    for preset in PRESETS:
        target = preset.apply(config).to_dict()
        if all(values[section] == target[section] for section in values):
            return preset.name
    return ""

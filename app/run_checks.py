"""What the trainer would reject, found before Start, beyond what RunConfig checks itself: choices this machine
cannot run and data that is not there.

The machine is read without torch (`hone.core.api.read_machine`: NVML and the package index for bitsandbytes), so the
check can run on a background thread at start and the window never waits for it.
"""

from __future__ import annotations

from hone.core.api import MachineFacts
from hone.core.config import RunConfig
from hone.core.errors import INSTALL_BITSANDBYTES

# Choices that only an NVIDIA GPU runs: (what it is, whether the config asks for it, what to choose instead).
GPU_ONLY = (
    ("QLoRA (a 4-bit base)", lambda c: c.lora.qlora, "turn off QLoRA under LoRA adapter"),
    ("The 8-bit optimizer", lambda c: c.train.optimizer == "adamw8bit", "choose the AdamW optimizer"),
    (
        "Offloading activations to host memory",
        lambda c: c.speed.checkpoint in ("offload", "offload-double"),
        "set Activation checkpoints to Auto or Recompute",
    ),
)
NEEDS_BITSANDBYTES = (
    ("QLoRA (a 4-bit base)", lambda c: c.lora.qlora),
    ("The 8-bit optimizer", lambda c: c.train.optimizer == "adamw8bit"),
)


def machine_problems(config: RunConfig, machine: MachineFacts | None) -> list[str]:
    """Why this machine cannot run `config`, one sentence each; empty while the machine is not known yet."""
    if machine is None:
        return []
    problems = []
    if not machine.has_gpu:
        for what, asked, instead in GPU_ONLY:
            if asked(config):
                problems.append(f"{what} needs an NVIDIA GPU, and this computer has none: {instead}.")
    elif not machine.bitsandbytes:
        for what, asked in NEEDS_BITSANDBYTES:
            if asked(config):
                problems.append(
                    f"{what} needs the bitsandbytes package, which is not installed: install it "
                    f"({INSTALL_BITSANDBYTES}) or choose otherwise."
                )
    return problems


def data_problems(config: RunConfig) -> list[str]:
    """Data entries that name nothing readable (a missing file, a folder without data files)."""
    from hone.core.api import SourceError, resolve_sources

    problems = []
    for side, entries in (("Training", config.data.train), ("Evaluation", config.data.eval)):
        for entry in entries:
            try:
                resolve_sources([entry], side="train" if side == "Training" else "eval")
            except SourceError as e:
                problems.append(f"{side} data: {e.message}. Choose it again on the Data page.")
    return problems


def run_problems(config: RunConfig, machine: MachineFacts | None) -> list[str]:
    """Every reason the trainer would refuse `config` on this machine that the config itself cannot know (its own
    checks, across sections too, run in RunConfig and show on the form)."""
    return machine_problems(config, machine) + data_problems(config)

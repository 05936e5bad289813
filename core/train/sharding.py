"""`train.parallel`: how several processes hold the model. `ddp` keeps the whole model on every process (the
default, hone.core.train.distributed sums the LoRA gradients); `fsdp` splits each decoder layer's frozen weights
across the processes with torch's FSDP2 (`fully_shard`), for a base model one GPU cannot hold.

Under `fsdp` a layer's weights are gathered for its forward and again for its backward, then freed; the trainable
LoRA weights are left out of the sharding (`ignored_params`), so they stay whole on every process and their
gradients are summed exactly as under `ddp`, and checkpoints, the adapter and the optimizer see plain tensors. The
embeddings, final norm and LM head stay whole too (the host tables and the chunked loss read them outside any
layer's forward). Every gather is a collective, so every process must run as many forward and backward passes as
the others: a process with fewer micro-batches in a step (or evaluation) runs one again with zero weight
(hone.core.train.step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hone.core.config import RunConfig
from hone.core.errors import ConfigError

if TYPE_CHECKING:  # torch stays unimported: the studio's Train page asks `refusal` on its GUI thread
    import torch

    from hone.core.train.distributed import World


def refusal(config: RunConfig, *, is_vision: bool) -> tuple[str, str]:
    """(why this run's model cannot be split, in words; the setting behind it), or ("", "") when it can."""
    if config.lora.qlora:
        return (
            "4-bit base weights are not split across GPUs yet (their quantization state would stay whole)",
            "lora.qlora",
        )
    if config.lora.modules_to_save or is_vision:
        return (
            "modules trained in full, such as a vision model's projector, are not split across GPUs yet",
            "lora.modules_to_save" if config.lora.modules_to_save else "the model",
        )
    if config.speed.compile:
        return "compiled decoder blocks are not combined with splitting yet", "speed.compile"
    return "", ""


def choose(config: RunConfig, world: World, *, is_vision: bool, fits_whole: bool | None) -> tuple[str, str]:
    """("ddp" | "fsdp", why) for a run on `world`. `fits_whole`: whether the memory planner found the step fits
    with the whole model on each process (None: it could not tell)."""
    asked = config.train.parallel
    if not world.launched:
        return "ddp", "one process"
    why_not, setting = refusal(config, is_vision=is_vision)
    if asked == "fsdp":  # also one process under torchrun, asked explicitly: the path runs, with nothing to split
        if why_not:
            raise ConfigError(f"train.parallel = fsdp ({setting}): {why_not}", "use train.parallel = ddp (or auto)")
        return "fsdp", "train.parallel = fsdp"
    if world.size == 1:
        return "ddp", "one process"
    if asked == "ddp":
        return "ddp", "train.parallel = ddp"
    if fits_whole is False and not why_not:
        return "fsdp", "the step does not fit with the whole model on each GPU"
    return "ddp", (
        "the whole model fits each process's memory"
        if fits_whole
        else "the memory planner could not tell, and the whole model on each process is the faster layout"
    )


def shard_frozen_weights(model: torch.nn.Module, world: World, device: str) -> str:
    """Split the frozen weights of every decoder layer of `model` (a peft model) across the processes; returns a
    line for the run's speed report."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hone.core.speed.checkpointing.checkpointer import decoder_layers

    layers = decoder_layers(model)
    if not layers:
        raise ConfigError(
            "train.parallel = fsdp: this model's decoder layers were not found", "use train.parallel = ddp"
        )
    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world.size,))
    split = 0
    for layer in layers:
        trainable = {p for p in layer.parameters() if p.requires_grad}
        split += sum(p.numel() for p in layer.parameters() if not p.requires_grad)
        fully_shard(layer, mesh=mesh, ignored_params=trainable)
    processes = f"{world.size} process{'es' if world.size > 1 else ''}"
    return (
        f"FSDP2 over {processes}: the frozen weights of {len(layers)} decoder layers "
        f"({split / 1e9:.2f} B values) split {world.size} ways, each layer's gathered for its forward and "
        "backward; LoRA weights whole on every process, their gradients summed; embeddings and LM head whole"
    )

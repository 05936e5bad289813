"""Whether a run's steps may be recorded as CUDA graphs (`speed.cuda_graphs`, hone.core.speed.step_graphs), and
why not: from the model and the speed settings, and from the training settings (method, processes, dropout,
optimizer). No torch here: the memory planner asks too.
"""

from __future__ import annotations

# auto records graphs for models up to this size: larger ones keep the GPU busy while the host launches (the
# 8B step is bound by its GEMMs: docs/performance/dense.md), and a graph's memory pool is held next to the
# eager allocator's.
AUTO_MAX_PARAMS = 3_000_000_000


def model_choice(
    mode: str,
    device: str,
    *,
    params: int,
    is_moe: bool,
    is_vision: bool,
    cfg,
    attention_blocker: str | None = None,
    settings_blocker: str | None = None,
) -> tuple[bool, str]:
    """Whether a run of this model may record its steps (`speed.cuda_graphs`), and why, from what is known
    before the trainer exists: the device, the model and the speed settings (`cfg`, a SpeedConfig whose
    checkpoint mode is the chosen one). `attention_blocker`: why the model's attention cannot be replayed (it
    reads each batch's row lengths on the host, so a replay would reuse the recorded batch's), or None;
    `settings_blocker`: why the training settings rule graphs out (`settings_blocker()`), or None."""
    if mode == "off":
        return False, "off (speed.cuda_graphs = off)"
    if not str(device).startswith("cuda"):
        return False, "off: CUDA graphs need an NVIDIA GPU"
    blockers = [
        (settings_blocker is not None, settings_blocker),
        (not cfg.packing, "rows are padded, not packed (speed.packing = false)"),
        (is_vision, "vision batches change shape with their images"),
        (str(cfg.checkpoint).startswith("offload"), "offloaded checkpoints copy through host memory each step"),
        (cfg.layer_group_tokens != 0, "layers back-propagate in groups sized per batch (speed.layer_group_tokens)"),
        (attention_blocker is not None, attention_blocker),
    ]
    if mode == "auto":
        blockers += [
            (is_moe, "auto leaves MoE models to their expert kernels (speed.cuda_graphs = on tries)"),
            (
                params > AUTO_MAX_PARAMS,
                f"auto records only models up to {AUTO_MAX_PARAMS / 1e9:.0f}B parameters, whose steps wait on the CPU",
            ),
        ]
    for blocked, why in blockers:
        if blocked:
            return False, f"off: {why}"
    return True, "each packed micro-batch's forward and backward recorded once per shape and replayed"


def run_choice(*, method: str, processes: int, dropout: float, optimizer: str, takes_gradients: bool) -> str | None:
    """Why a run whose model may record graphs still cannot (None: it can), from the training settings:
    `method` (train.method), `processes` sharing the step, LoRA `dropout`, and the `optimizer`'s name and
    whether it `takes_gradients` away as they are made (adamw-bf16's flat buffer)."""
    if method != "sft":
        return f"train.method = {method}: its batches are not plain packed rows"
    if processes > 1:
        return "several processes sum their gradients between micro-batches"
    if dropout > 0:
        return "LoRA dropout draws random numbers a replay would repeat"
    if takes_gradients:
        return f"train.optimizer = {optimizer} takes each gradient away as it is made"
    return None


def settings_blocker(config, processes: int = 1) -> str | None:
    """`run_choice` from a RunConfig (the optimizer known by its name), before the trainer builds anything."""
    return run_choice(
        method=config.train.method,
        processes=processes,
        dropout=config.lora.dropout,
        optimizer=config.train.optimizer,
        takes_gradients=config.train.optimizer == "adamw-bf16",
    )

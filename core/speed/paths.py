"""The speed paths switched on for a run, in order, each choice recorded with its reason.

`install_attention_and_experts` runs before LoRA: the attention backend and the MoE experts backend change how
the base model computes. `install_memory_and_kernels` runs after LoRA: activation checkpointing (possibly
offloaded), the fused kernels, compilation and the vocabulary tables in host memory wrap what LoRA produced.
Each path lives in its own module or subpackage with its reference, probe, undo and tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hone.core.config import SpeedConfig
from hone.core.events import Notice
from hone.core.model_info import ModelInfo


@dataclass
class SpeedSetup:
    """What a run uses: `choices` go into RunStarted.speed_paths, `notices` become Notice events."""

    choices: dict[str, str] = field(default_factory=dict)
    notices: list[Notice] = field(default_factory=list)
    attention: object | None = None  # the attention Choice (hone.core.speed.attention): what `revert` undoes
    expert_meter: object | None = None  # MoE expert-load meter, read once per step
    offload: object | None = None  # checkpoint offloader, read once per step
    compile: object | None = None  # CompileReport: compile seconds are taken out of step times
    host_tables: object | None = None  # HostTables (hone.core.speed.host_tables): vocabulary tables in host memory
    cuda_graphs: bool = False  # the model may have its steps recorded as CUDA graphs (hone.core.speed.step_graphs)

    def note(self, topic: str, message: str, level: str = "info") -> None:
        self.notices.append(Notice(topic=topic, message=message, level=level))


def install_attention_and_experts(model, cfg: SpeedConfig, info: ModelInfo, device: str) -> SpeedSetup:
    """Attention backend and MoE experts implementation, chosen once per run."""
    from hone.core.speed import attention

    setup = SpeedSetup()
    choice = setup.attention = attention.configure(model, cfg, device)
    setup.choices["attention"] = f"{choice.name}: {choice.reason}"
    if info.is_moe:
        from hone.core.speed import moe
        from hone.core.speed.moe.family_report import describe as describe_family

        choice = moe.configure(model, cfg.moe_backend, device, fused_gate=cfg.kernels)
        setup.choices["moe"] = f"{choice.name}: {choice.reason}"
        setup.expert_meter = moe.ExpertLoadMeter(model)
        family = describe_family(model)
        if family is not None:
            setup.choices["moe family"] = "; ".join(family.lines())
    return setup


def install_memory_and_kernels(
    peft_model,
    cfg: SpeedConfig,
    info: ModelInfo,
    device: str,
    setup: SpeedSetup,
    mean_row_tokens: float,
    graphs_blocker: str | None = None,
) -> None:
    """Activation checkpointing (possibly offloaded), then fused kernels and compilation, then CUDA graphs and the
    vocabulary tables. `graphs_blocker`: why the run's settings rule CUDA graphs out (`settings_blocker`), if so."""
    from hone.core.speed.checkpointing import checkpointer, policy

    choice = policy.choose_mode(cfg.checkpoint, device, mean_row_tokens, peft_model.get_base_model().config)
    choice = _checkpoint_for_graphs(peft_model, cfg, choice, info, device, setup, graphs_blocker)
    if choice.notice:
        setup.note("checkpoint", choice.notice, choice.level)
    setup.choices["checkpoint"] = f"{choice.mode}: {choice.reason}"
    if choice.mode != "off":
        setup.offload = checkpointer.apply_checkpointing(
            peft_model,
            choice.mode,
            device,
            note=setup.note,
            group_tokens=cfg.layer_group_tokens,
            kept_layers=max(0, cfg.keep_layer_activations),  # auto (-1) is resolved by the memory plan, or none
        )
        if setup.offload is None:
            setup.choices["checkpoint"] = "off: the model has no decoder layers transformers can checkpoint"
        elif cfg.layer_group_tokens:
            tokens = cfg.layer_group_tokens if cfg.layer_group_tokens > 0 else "auto"
            setup.choices["checkpoint"] += (
                f"; packed layers back-propagated in groups of whole sequences (at most {tokens} tokens)"
            )
        if setup.offload is not None and setup.offload.kept_layers:
            layers = len(checkpointer.decoder_layers(peft_model))
            setup.choices["checkpoint"] += (
                f"; the last {setup.offload.kept_layers} of {layers} layers keep their activations (not recomputed)"
            )
    _kernels_and_compile(peft_model, cfg, device, setup)
    _projection_recompute(peft_model, setup)
    _cuda_graphs(peft_model, cfg, choice.mode, info, device, setup, graphs_blocker)
    if setup.cuda_graphs:  # a recorded step reads the tables where they are; host tables copy every step
        setup.choices["embeddings"] = setup.choices["lm_head"] = "on the GPU: the steps are recorded as CUDA graphs"
    else:
        _embeddings(peft_model, cfg, device, setup)


def _projection_recompute(peft_model, setup: SpeedSetup) -> None:
    """Large batches run the head-normed q/k projections again in backward (projection_recompute.py). Not under
    torch.compile: the hooks it adds and removes around each recompute would recompile the blocks."""
    from hone.core.speed.checkpointing.checkpointer import decoder_layers
    from hone.core.speed.checkpointing.projection_recompute import RECOMPUTE_TOKENS, projections

    if setup.offload is None or setup.compile is not None:
        return
    if not any(projections(layer) for layer in decoder_layers(peft_model)):
        return
    setup.offload.projection_recompute_tokens = RECOMPUTE_TOKENS
    setup.choices["checkpoint"] += (
        f"; batches of {RECOMPUTE_TOKENS:,} tokens or more run the q/k projections again for their head norms' "
        "backward instead of keeping them"
    )


def _graphs_possible(peft_model, cfg: SpeedConfig, checkpoint_mode: str, info: ModelInfo, device: str, setup,
                     graphs_blocker: str | None) -> tuple[bool, str]:  # fmt: skip
    from hone.core.speed.graph_choice import model_choice

    return model_choice(
        cfg.cuda_graphs,
        device,
        params=info.params,
        is_moe=info.is_moe,
        is_vision=info.is_vision,
        cfg=dataclasses.replace(cfg, checkpoint=checkpoint_mode),
        attention_blocker=_attention_blocker(peft_model, setup),
        settings_blocker=graphs_blocker,
    )


def _checkpoint_for_graphs(peft_model, cfg: SpeedConfig, choice, info: ModelInfo, device: str, setup: SpeedSetup,
                           graphs_blocker: str | None):  # fmt: skip
    """`auto`'s offloaded checkpoints give way to recompute on the GPU where that lets the steps be recorded as
    CUDA graphs: the models graphs are for hold their layer inputs in little memory (Qwen3-0.6B: 28 x 2 KiB a
    token), and a recorded step gains more than the offload saves (docs/performance/host-time.md)."""
    from hone.core.speed.checkpointing.policy import ModeChoice

    if cfg.checkpoint != "auto" or not choice.mode.startswith("offload"):
        return choice
    if not _graphs_possible(peft_model, cfg, "gpu", info, device, setup, graphs_blocker)[0]:
        return choice
    return ModeChoice(
        "gpu", f"layer inputs kept on the GPU so the steps can be recorded as CUDA graphs (else: {choice.reason})"
    )


def _cuda_graphs(peft_model, cfg: SpeedConfig, checkpoint_mode: str, info: ModelInfo, device: str, setup: SpeedSetup,
                 graphs_blocker: str | None) -> None:  # fmt: skip
    setup.cuda_graphs, setup.choices["cuda_graphs"] = _graphs_possible(
        peft_model, cfg, checkpoint_mode, info, device, setup, graphs_blocker
    )


def _attention_blocker(peft_model, setup: SpeedSetup) -> str | None:
    """Why the run's attention cannot be replayed from a recording: a backend that splits each batch by its row
    lengths on the host (the split would be the recorded batch's), or None."""
    from hone.core.speed.attention.linear_attention import gated_deltanet_modules

    choice = setup.attention
    if choice is None or choice.name not in ("varlen", "flash"):
        name = "transformers'" if choice is None or choice.name == "hf" else f"the {choice.name}"
        return f"{name} attention reads each batch's row lengths on the host"
    if choice.varlen is not None and choice.varlen.grouped_backward:
        return "the grouped attention backward splits each batch on the host (speed.grouped_attention_backward)"
    if gated_deltanet_modules(peft_model):
        return "Gated DeltaNet layers read each batch's row lengths on the host"
    return None


def _embeddings(peft_model, cfg: SpeedConfig, device: str, setup: SpeedSetup) -> None:
    """The frozen vocabulary tables to host memory where they can go (`hone.core.speed.host_tables`)."""
    from hone.core.speed.host_tables import apply_host_tables

    tables = apply_host_tables(
        peft_model, device, embedding=cfg.host_embeddings, head=cfg.host_lm_head, chunked_loss=cfg.loss == "chunked"
    )
    setup.host_tables = tables
    if isinstance(tables.embedding, str):
        setup.choices["embeddings"] = f"on the GPU: {tables.embedding}"
    else:
        setup.choices["embeddings"] = (
            f"input-embedding table ({_gib(tables.embedding.table):.2f} GiB) in pinned "
            "host memory; each batch's rows looked up on the CPU by the collation"
        )
    if isinstance(tables.head, str):
        setup.choices["lm_head"] = f"on the GPU: {tables.head}"
    else:
        shared = " (the tied input table)" if tables.head.table is getattr(tables.embedding, "table", None) else ""
        setup.choices["lm_head"] = (
            f"LM head ({_gib(tables.head.table):.2f} GiB){shared} in pinned host memory; "
            "copied to the GPU once per step, while the forward runs, for the loss"
        )


def _gib(tensor) -> float:
    return tensor.numel() * tensor.element_size() / 2**30


def _kernels_and_compile(peft_model, cfg: SpeedConfig, device: str, setup: SpeedSetup) -> None:
    """Fused kernels (CUDA only: on the CPU the references would run, which is the plain path anyway), then
    regional compilation of the (possibly fused) decoder blocks."""
    if cfg.kernels and str(device).startswith("cuda"):
        from hone.core.speed.fused.apply import apply_kernels

        report = apply_kernels(peft_model, tile_mlp=cfg.tiled_mlp)
        setup.choices["kernels"] = report.summary()
        for reason, names in report.skipped.items():
            setup.note("kernels", f"{len(names)} modules keep transformers' code: {reason}")
    elif cfg.kernels:
        setup.choices["kernels"] = "off: Hone's fused kernels need an NVIDIA GPU"
    else:
        setup.choices["kernels"] = "off (speed.kernels = false)"
    if cfg.compile:
        from hone.core.speed.compile import compile_blocks

        setup.compile = compile_blocks(peft_model)
        setup.choices["compile"] = f"{setup.compile.blocks} decoder blocks with torch.compile"

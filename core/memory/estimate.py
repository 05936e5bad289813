"""Predict the peak GPU memory of one training step from the model's shape and the run's settings, and the host
memory its offloaded parts hold (`estimate_host`).

The step's peak is what stays allocated across steps (weights, LoRA weights and optimizer state, checkpoint
buffers) plus the largest of three transients: a decoder layer's forward, the first recomputed layer's backward,
and the chunked loss. Each part follows what Hone's speed paths keep (docs/performance/memory.md says where each
figure comes from); the constants were calibrated against measured `hone bench` peaks
(docs/performance/memory-planner.md, `tools/memory_calibration.py`). Plain arithmetic: no torch, no GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hone.core.machine.pinned_memory import pinned_slot_bytes
from hone.core.memory.shape import ModelShape

GIB = 1024**3
# nf4 with double quantization: 4 bits per weight, an 8-bit absmax per 64 weights and an fp32 scale per 256 absmax.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
# Bytes per trainable LoRA value kept across steps (fp32 weight + optimizer state) and its gradient in backward.
OPTIMIZER_STATE_BYTES = {"adamw": 4 + 8, "adamw8bit": 4 + 2, "adamw-bf16": 4 + 4}
GRADIENT_BYTES = {"adamw": 4, "adamw8bit": 4, "adamw-bf16": 2}
# The tiled MLP backward holds ~7 tensors of one tile (2**25 elements, core/speed/checkpointing/tiled_mlp.py):
# gate, up and their product, and the gradients towards them and the tile's input.
TILED_MLP_TENSORS = 7
TILE_ELEMENTS = 2**25
# A checkpointed forward over at least this many tiles runs its MLP a tile at a time (PIECEWISE_MIN_TILES there).
PIECEWISE_MIN_TILES = 8
# An untiled MLP backward holds gate, up, product and their three gradients for the whole batch.
UNTILED_MLP_TENSORS = 6
# The no-grad forward of a checkpointed layer's MLP holds gate, up, the activation and the product.
MLP_FORWARD_TENSORS = 4
# What an MLP keeps for its backward when its layer is not recomputed: Hone's fused GLU saves gate and up and
# recomputes the activation; the down projection saves its input. Plain torch also saves the activation.
MLP_SAVED_TENSORS, MLP_SAVED_TENSORS_PLAIN = 3, 4
# What a recomputed layer saves for its attention half, in units of (tokens x width) bf16 tensors: the input norm's
# output, the residual and the MLP norm's output (3 x hidden); q, k and v, before and after norm and rope, and the
# attention output (3 x q width, 3 x kv width).
SAVED_ATTENTION_HIDDEN, SAVED_ATTENTION_PROJECTIONS = 3, 3
# From this many batch tokens a recomputed layer runs its q/k projections again for their head norms' backward
# instead of keeping them (RECOMPUTE_TOKENS in core/speed/checkpointing/projection_recompute.py): one q and one kv
# width fewer saved. Models without head norms never kept them, so the figure is right for them too.
PROJECTION_RECOMPUTE_TOKENS = 1 << 17
# Flash attention's backward workspace per query value: an fp32 dq accumulator, and dk, dv expanded to every query
# head (grouped-query attention), on top of dq, dk and dv themselves.
ATTENTION_WORKSPACE_BYTES = 4 + 2 + 2
# One loss chunk (core/train/loss.py): Hone's fused cross-entropy keeps 2**27 bf16 logits, overwritten by their
# gradient; the plain chunked loss 2**26 fp32 logits and their bf16 copy and gradient.
FUSED_LOSS_CHUNK_BYTES = 2**28
LOSS_CHUNK_BYTES = 2**29
# What the caching allocator adds over the live tensors at the peak (block rounding, fragmentation).
ALLOCATOR_SLACK = 0.04
# A run on the CPU: its peak resident memory over this prediction of its tensors. Measured for SmolLM2-135M in
# float32 at 1,024 and 2,048-token batches, checkpointing off and on (torch 2.13): 1.61-1.88, which 1.75 meets
# within 9 % (the process itself, freed memory the allocator returns to the system late, float32 temporaries the
# GPU path runs in bf16); docs/performance/memory-planner.md.
CPU_RESIDENT_FACTOR = 1.75
PHASE_WORDS = {"generation": "sampling's KV cache and logits, beyond the checkpoints"}


@dataclass(frozen=True)
class MemorySettings:
    """The run settings the peak depends on (from a RunConfig: `settings_from_config`)."""

    batch_tokens: int
    lora_rank: int = 16
    lora_experts: bool = True
    qlora: bool = False
    optimizer: str = "adamw"
    weight_bytes: int = 2  # bf16 / fp16; 4 for float32
    checkpoint: str = "offload-double"  # the resolved mode: off, gpu, offload, offload-double
    host_embeddings: bool = True
    host_lm_head: bool = True
    # steps recorded as CUDA graphs (speed.cuda_graphs): the tables stay on the GPU and `auto` keeps the checkpoints
    # there; a fit that moves either to the host turns the graphs off
    cuda_graphs: bool = False
    tiled_mlp: bool = True
    # large batches run the head-normed q/k projections again in backward (not under torch.compile)
    projection_recompute: bool = True
    chunked_loss: bool = True
    kernels: bool = True  # Hone's fused kernels (the fused cross-entropy among them)
    cpu: bool = False  # the run trains on the CPU: its peak is resident system memory
    # Offload modes: the bytes of pinned host slots the offloaded layer inputs may hold (None: no limit). The
    # checkpointer offloads layer inputs in forward order until its slots reach this budget and keeps the rest on
    # the GPU (`offloaded_layers`).
    host_slot_budget: float | None = None
    # The last this many decoder layers keep every activation for backward instead of being recomputed
    # (speed.keep_layer_activations): they run after the checkpointed ones, so their activations are alive from
    # their forward through the loss to their own backward, and freed before any checkpointed layer is recomputed.
    kept_layers: int = 0
    # GRPO (train.method = grpo): a step first samples completions of up to this many tokens for its micro-batch's
    # prompts (0: no generation). Its sequences, prompt and completion, fill the micro-batch's tokens.
    generation_completion: int = 0


@dataclass(frozen=True)
class Part:
    name: str
    bytes: float
    note: str = ""


@dataclass(frozen=True)
class MemoryEstimate:
    """The predicted peak of one step, by part. `phase` names the transient that sets the peak."""

    parts: tuple[Part, ...]
    phase: str

    @property
    def peak_bytes(self) -> float:
        return sum(part.bytes for part in self.parts)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    def part(self, name: str) -> float:
        return sum(part.bytes for part in self.parts if part.name == name)

    def summary(self) -> str:
        largest = sorted(self.parts, key=lambda part: -part.bytes)[:3]
        return ", ".join(f"{part.name} {part.bytes / GIB:.2f}" for part in largest)


def estimate_peak(shape: ModelShape, settings: MemorySettings) -> MemoryEstimate:
    """The peak GPU memory of one training step."""
    s, w, tokens = settings, settings.weight_bytes, settings.batch_tokens
    linear_bytes = shape.linear_params * (NF4_BYTES if s.qlora else w)
    tables = shape.vocab * shape.hidden * w
    tables_on_gpu = 0.0 if s.host_embeddings else tables
    if not shape.tied_embeddings:
        tables_on_gpu += 0.0 if (s.host_lm_head and s.chunked_loss) else tables
    elif not (s.host_lm_head and s.chunked_loss):
        tables_on_gpu = tables  # one tied table: it stays on the GPU unless both lookups move to the host
    head_copy = tables if (s.host_lm_head and s.chunked_loss) else 0.0  # copied in for each step's loss
    trainable = shape.lora_params(s.lora_rank, s.lora_experts)
    lora_state = trainable * OPTIMIZER_STATE_BYTES.get(s.optimizer, OPTIMIZER_STATE_BYTES["adamw"])
    gradients = trainable * GRADIENT_BYTES.get(s.optimizer, 4)
    row = tokens * shape.hidden * w  # one (tokens x hidden) bf16 tensor
    recomputed = checkpointed_layers(shape, s)
    kept = (recomputed - offloaded_layers(shape, s)) * row  # offload modes: inputs past the host budget
    checkpoints = {
        "off": shape.layers * _layer_activations(shape, tokens, w, s.kernels),
        "gpu": recomputed * row,
        "offload": row + kept,
        "offload-double": 2 * row + kept,
    }[s.checkpoint]
    # the layers that keep their activations: alive through the loss and their own backward (not in "off", where
    # `checkpoints` holds every layer's already)
    kept_layers = 0 if s.checkpoint == "off" else shape.layers - recomputed
    kept_activations = kept_layers * _layer_activations(shape, tokens, w, s.kernels)

    forward = head_copy + _layer_forward(shape, tokens, w, s.tiled_mlp)
    # A recomputed layer back-propagates its MLP first, then its attention: what the attention half saved is alive
    # through both, the MLP's and the attention's own workspaces one after the other.
    saved, workspace = _attention_backward(shape, tokens, w, s.projection_recompute)
    if s.checkpoint == "off":  # every layer's activations are already counted as checkpoints
        saved = 0.0
    backward = gradients + 2 * row + saved + max(workspace, _mlp_backward(shape, tokens, w, s))
    all_logits = tokens * shape.vocab * (4 + 2 * w)  # fp32 logits, and their bf16 copy and gradient
    chunk = FUSED_LOSS_CHUNK_BYTES if s.kernels else LOSS_CHUNK_BYTES
    loss = head_copy + (min(chunk, all_logits) if s.chunked_loss else all_logits) + row + kept_activations
    phases = [("forward", forward), ("backward", backward), ("loss", loss)]
    if kept_activations:
        # the last kept layer's backward: every kept layer's activations, and its whole (untiled) MLP's gradients
        untiled = dataclasses.replace(s, tiled_mlp=False)
        kept_backward = (
            gradients + 2 * row + kept_activations + max(workspace, _mlp_backward(shape, tokens, w, untiled))
        )
        phases.append(("kept layers' backward", kept_backward))
    if s.generation_completion:
        # Sampling holds no checkpoints, but the KV cache of every sequence it extends (keys and values, every layer)
        # and one position's logits per sequence (the model's dtype, and fp32 for sampling).
        kv_cache = tokens * shape.layers * 2 * shape.kv_heads * shape.head_dim * w
        sequences = max(1, tokens // s.generation_completion)
        phases.append(("generation", kv_cache + sequences * shape.vocab * (w + 4) - checkpoints))
    phase, transient = max(phases, key=lambda p: p[1])
    held = kept_activations if phase in ("loss", "kept layers' backward") else 0.0

    parts = [
        Part("weights", linear_bytes, "decoder layers" + (" in 4-bit nf4" if s.qlora else "")),
        Part("vocabulary tables", tables_on_gpu, "input embedding and LM head on the GPU"),
        Part("LoRA + optimizer", lora_state, f"{trainable / 1e6:.1f}M trainable values, {s.optimizer}"),
        Part("checkpoints", checkpoints, f"activation checkpointing: {s.checkpoint}"),
        Part("step", transient - held, "the largest transient: " + PHASE_WORDS.get(phase, phase)),
    ]
    if held:
        parts.insert(-1, Part("kept activations", held, f"the last {kept_layers} layers' activations, not recomputed"))
    live = sum(part.bytes for part in parts)
    if s.cpu:
        parts.append(
            Part(
                "process and allocator",
                live * (CPU_RESIDENT_FACTOR - 1),
                "resident memory of a CPU run beyond its tensors (measured)",
            )
        )
    else:
        parts.append(Part("allocator slack", live * ALLOCATOR_SLACK, "block rounding and fragmentation"))
    return MemoryEstimate(tuple(parts), phase)


def _mlp_width(shape: ModelShape) -> tuple[int, int]:
    """(intermediate width per token, routed copies per token) of the widest MLP."""
    if shape.experts and shape.moe_layers:
        return shape.expert_intermediate * shape.top_k + shape.shared_intermediate, shape.top_k
    return shape.intermediate, 0


def _layer_forward(shape: ModelShape, tokens: int, w: int, tiled: bool) -> float:
    """A checkpointed layer's no-grad forward: its MLP's activations for the whole batch (and routed copies), or
    for one tile where the batch holds many (a tiled dense MLP), beside the output the pieces are written into."""
    width, routed = _mlp_width(shape)
    if tiled and not shape.experts and tokens * width >= PIECEWISE_MIN_TILES * TILE_ELEMENTS:
        return MLP_FORWARD_TENSORS * TILE_ELEMENTS * w + tokens * shape.hidden * w
    return tokens * w * (MLP_FORWARD_TENSORS * width + routed * shape.hidden)


def _attention_backward(shape: ModelShape, tokens: int, w: int, projection_recompute: bool) -> tuple[float, float]:
    """(what the attention half of a recomputed layer saves, its backward's workspace)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    projections = SAVED_ATTENTION_PROJECTIONS - int(projection_recompute and tokens >= PROJECTION_RECOMPUTE_TOKENS)
    saved = tokens * w * (SAVED_ATTENTION_HIDDEN * shape.hidden + projections * (q + kv))
    workspace = tokens * q * ATTENTION_WORKSPACE_BYTES + tokens * (q + 2 * kv) * w
    return saved, workspace


def _mlp_backward(shape: ModelShape, tokens: int, w: int, s: MemorySettings) -> float:
    width, routed = _mlp_width(shape)
    if s.tiled_mlp and not shape.experts:
        return TILED_MLP_TENSORS * min(TILE_ELEMENTS, tokens * width) * w
    return tokens * w * (UNTILED_MLP_TENSORS * width + 2 * routed * shape.hidden)


def _layer_activations(shape: ModelShape, tokens: int, w: int, kernels: bool) -> float:
    """Everything one layer keeps for its backward when it is not recomputed."""
    width, routed = _mlp_width(shape)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return (
        tokens
        * w
        * (
            SAVED_ATTENTION_HIDDEN * shape.hidden
            + SAVED_ATTENTION_PROJECTIONS * (q + kv)
            + (MLP_SAVED_TENSORS if kernels else MLP_SAVED_TENSORS_PLAIN) * width
            + routed * shape.hidden
        )
    )


def checkpointed_layers(shape: ModelShape, settings: MemorySettings) -> int:
    """Decoder layers recomputed in backward from their saved input: all but the `kept_layers` (none in "off")."""
    if settings.checkpoint == "off":
        return 0
    return max(0, shape.layers - max(0, settings.kept_layers))


def offloaded_layers(shape: ModelShape, settings: MemorySettings) -> int:
    """Decoder layers whose input goes to a pinned host slot: every layer in offload modes, or as many slots of one
    input as `host_slot_budget` holds; none in the other modes."""
    s = settings
    if s.checkpoint not in ("offload", "offload-double"):
        return 0
    layers = checkpointed_layers(shape, s)
    if s.host_slot_budget is None:
        return layers
    slot = pinned_slot_bytes(s.batch_tokens * shape.hidden * s.weight_bytes)
    return max(0, min(layers, int(s.host_slot_budget // slot)))


def estimate_host(shape: ModelShape, settings: MemorySettings) -> MemoryEstimate:
    """The host memory a GPU run's step holds beyond the process itself: each offloaded layer input in a pinned
    slot of its own (`pinned_slot_bytes`), and the vocabulary tables kept in host memory."""
    s, w = settings, settings.weight_bytes
    row = s.batch_tokens * shape.hidden * w
    layers = offloaded_layers(shape, s)
    offloaded = float(layers * pinned_slot_bytes(row))
    table = shape.vocab * shape.hidden * w
    if shape.tied_embeddings:
        tables = table if (s.host_embeddings or (s.host_lm_head and s.chunked_loss)) else 0.0
    else:
        tables = table * (int(s.host_embeddings) + int(s.host_lm_head and s.chunked_loss))
    parts = (
        Part("offloaded checkpoints", offloaded, f"{layers} layer inputs in pinned host memory"),
        Part("vocabulary tables", tables, "input embedding and LM head in host memory"),
    )
    return MemoryEstimate(parts, "host")

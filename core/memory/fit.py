"""Auto-fit: the largest batch and the cheapest memory levers with which a run's step fits in the memory given.

Levers are tried in order of what they cost in speed: host vocabulary tables and the tiled MLP cost almost nothing,
offloaded checkpoints little, recompute from inputs on the GPU nothing but memory, a smaller batch some throughput,
QLoRA (only when allowed) accuracy and time. The batch never goes below the longest row. Given the host's
memory, offloaded checkpoints are only chosen where the host holds them (`estimate_host`): where it cannot even at the
longest row, the run keeps its checkpoints on the GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hone.core.memory.estimate import (
    GIB,
    MemoryEstimate,
    MemorySettings,
    estimate_host,
    estimate_peak,
    offloaded_layers,
)
from hone.core.memory.shape import ModelShape

# Headroom left free beyond the prediction: the calibration's largest error (8.7 %), the caching allocator's
# fragmentation under a hard limit (Qwen3-8B QLoRA predicted at 7.0 GiB ran out of an 8 GiB cap at its 16K batch,
# docs/performance/memory-planner.md), and what other processes (the desktop, a second model on the Chat page) take.
HEADROOM = 0.15
BATCH_MULTIPLE = 256  # batch sizes tried: multiples of this many tokens
OFFLOAD_MODES = ("offload", "offload-double")


@dataclass(frozen=True)
class FitResult:
    """What auto-fit chose, or why nothing fits (`fits` False, `reason` set)."""

    fits: bool
    settings: MemorySettings
    estimate: MemoryEstimate
    available_bytes: float
    changes: tuple[str, ...] = ()  # what differs from the run's own settings, in words
    reason: str = ""
    largest_max_length: int = 0  # when nothing fits: the longest row that would
    # What the plan counts beyond the run's settings that needs no change from the user: the layer inputs the host
    # cannot hold, which the checkpointer keeps on the GPU by itself.
    notes: tuple[str, ...] = ()

    def assignments(self, current: MemorySettings) -> list[str]:
        """The run-config assignments (`section.key=value`) that turn `current` into the chosen settings."""
        chosen, out = self.settings, []
        if chosen.batch_tokens != current.batch_tokens:
            out.append(f"train.batch_tokens={chosen.batch_tokens}")
        if chosen.checkpoint != current.checkpoint:
            out.append(f'speed.checkpoint="{chosen.checkpoint}"')
        if chosen.qlora != current.qlora:
            out.append(f"lora.qlora={'true' if chosen.qlora else 'false'}")
        for key in ("host_embeddings", "host_lm_head", "tiled_mlp"):
            if getattr(chosen, key) != getattr(current, key):
                out.append(f"speed.{key}={'true' if getattr(chosen, key) else 'false'}")
        if chosen.kept_layers != current.kept_layers:
            out.append(f"speed.keep_layer_activations={chosen.kept_layers}")
        if current.cuda_graphs and not chosen.cuda_graphs:  # recorded steps would keep the tables on the GPU
            out.append('speed.cuda_graphs="off"')
        return out


def usable(available_bytes: float) -> float:
    return available_bytes * (1 - HEADROOM)


def _fits(shape: ModelShape, settings: MemorySettings, budget: float, host_budget: float | None) -> bool:
    """Whether a step fits `budget` bytes of GPU memory and, when given, what it offloads fits `host_budget`."""
    if estimate_peak(shape, settings).peak_bytes > budget:
        return False
    return host_budget is None or estimate_host(shape, settings).peak_bytes <= host_budget


def _levers(settings: MemorySettings, allow_qlora: bool, unified: bool) -> list[tuple[MemorySettings, list[str]]]:
    """Settings to try, cheapest first, each with what it changed (`unified`: nothing is offloaded, for a GPU that
    shares system memory or a host too small to hold the checkpoints)."""
    every_layer = ({"kept_layers": 0}, "every layer recomputed from its input (none keeps its activations)")
    if settings.cpu:  # the vocabulary tables, tiles and offloading are GPU paths; QLoRA needs a GPU
        recompute = ({"checkpoint": "gpu"}, "activation checkpointing (recompute)")
        return _tried(settings, [every_layer, recompute] if settings.checkpoint == "off" else [every_layer])
    steps: list[tuple[dict, str]] = [
        every_layer,
        ({"host_embeddings": True, "host_lm_head": True, "cuda_graphs": False}, "vocabulary tables in host memory"),
        ({"tiled_mlp": True}, "MLP back-propagated in tiles"),
    ]
    if not unified:  # offloading frees nothing where the GPU shares system memory
        offloaded = "checkpoints offloaded to host memory"
        steps.append(({"checkpoint": "offload-double", "cuda_graphs": False}, f"{offloaded} (two reload buffers)"))
        steps.append(({"checkpoint": "offload", "cuda_graphs": False}, f"{offloaded} (one reload buffer)"))
    elif settings.checkpoint == "off":
        steps.append(({"checkpoint": "gpu"}, "activation checkpointing (recompute)"))
    if allow_qlora:
        steps.append(({"qlora": True}, "base weights in 4-bit (QLoRA)"))
    return _tried(settings, steps)


def _tried(settings: MemorySettings, steps: list[tuple[dict, str]]) -> list[tuple[MemorySettings, list[str]]]:
    tried: list[tuple[MemorySettings, list[str]]] = [(settings, [])]
    changed: list[str] = []
    current = settings
    for change, words in steps:
        updated = dataclasses.replace(current, **change)
        if updated != current:
            current, changed = updated, [*changed, words]
            tried.append((current, changed))
    return tried


def largest_batch(
    shape: ModelShape, settings: MemorySettings, budget: float, ceiling: int, host_budget: float | None = None
) -> int:
    """The largest multiple of BATCH_MULTIPLE up to `ceiling` tokens whose step fits `budget` bytes (and
    `host_budget`, when given), or 0."""
    low, high = 0, max(ceiling // BATCH_MULTIPLE, 1)
    while low < high:  # the peak grows with the batch: bisect on multiples
        middle = (low + high + 1) // 2
        trial = dataclasses.replace(settings, batch_tokens=middle * BATCH_MULTIPLE)
        if _fits(shape, trial, budget, host_budget):
            low = middle
        else:
            high = middle - 1
    return low * BATCH_MULTIPLE


def auto_fit(
    shape: ModelShape,
    settings: MemorySettings,
    available_bytes: float,
    longest_row: int,
    *,
    allow_qlora: bool = False,
    unified: bool = False,
    host_available: float | None = None,
) -> FitResult:
    """Fit the run's step into `available_bytes`: its own settings when they fit, else the cheapest levers and
    the largest batch (at least `longest_row` tokens, at most the run's own batch). With `host_available` (bytes of
    system memory), offloaded checkpoints must fit there too."""
    budget = usable(available_bytes)
    host_budget = usable(host_available) if host_available is not None else None
    settings, host_words = _keep_checkpoints_on_gpu(shape, settings, longest_row, host_budget)
    # Every input on the GPU is a setting the user applies (speed.checkpoint = gpu); some of them, only a note.
    forced, notes = (host_words, ()) if settings.checkpoint == "gpu" else ([], tuple(host_words))
    own = estimate_peak(shape, settings)
    if _fits(shape, settings, budget, host_budget):
        return FitResult(True, settings, own, available_bytes, tuple(forced), notes=notes)
    ceiling = max(settings.batch_tokens, longest_row)
    levers = _levers(settings, allow_qlora, unified or bool(forced))
    # Every lever that keeps the weights as they are comes before a smaller batch; QLoRA comes last, at the full
    # batch first.
    order = [(c, w, False) for c, w in levers if not c.qlora or settings.qlora]
    order.append((order[-1][0], order[-1][1], True))
    if allow_qlora and not settings.qlora and not settings.cpu:
        order += [(levers[-1][0], levers[-1][1], False), (levers[-1][0], levers[-1][1], True)]
    for candidate, changed, shrink in order:
        whole = dataclasses.replace(candidate, batch_tokens=ceiling)
        if shrink:
            batch = largest_batch(shape, candidate, budget, ceiling, host_budget)
        else:
            batch = ceiling if _fits(shape, whole, budget, host_budget) else 0
        if batch >= longest_row:
            chosen = dataclasses.replace(candidate, batch_tokens=batch)
            words = [*forced, *changed] + (
                [f"batch of {batch:,} tokens (was {settings.batch_tokens:,})"] if batch != settings.batch_tokens else []
            )
            return FitResult(True, chosen, estimate_peak(shape, chosen), available_bytes, tuple(words), notes=notes)
    return _nothing_fits(shape, levers[-1][0], available_bytes, longest_row, allow_qlora, host_budget, host_words)


def _keep_checkpoints_on_gpu(
    shape: ModelShape, settings: MemorySettings, longest_row: int, host_budget: float | None
) -> tuple[MemorySettings, list[str]]:
    """Offloaded checkpoints within what the host holds: the pinned slots get what `host_budget` leaves beside the
    vocabulary tables, and the inputs past it stay on the GPU, as the checkpointer does; where not one input fits
    at the longest row, every checkpoint stays on the GPU (recomputed from inputs kept there). The settings to plan
    with, and the change in words (none when every input is offloaded)."""
    if host_budget is None or settings.checkpoint not in OFFLOAD_MODES:
        return settings, []
    tables = estimate_host(shape, dataclasses.replace(settings, checkpoint="gpu")).peak_bytes
    limited = dataclasses.replace(settings, host_slot_budget=max(0.0, host_budget - tables))
    at_row = dataclasses.replace(limited, batch_tokens=max(longest_row, BATCH_MULTIPLE))
    at_batch = dataclasses.replace(limited, batch_tokens=max(settings.batch_tokens, at_row.batch_tokens))
    if offloaded_layers(shape, at_row) == 0:
        return dataclasses.replace(settings, checkpoint="gpu"), [
            f"checkpoints kept on the GPU: {_held(shape, at_row, host_budget)}"
        ]
    offloaded = offloaded_layers(shape, at_batch)
    if offloaded == shape.layers:
        return limited, []
    kept = f"{shape.layers - offloaded} of {shape.layers} layer inputs kept on the GPU"
    return limited, [f"{kept}: {_held(shape, at_batch, host_budget)}"]


def _held(shape: ModelShape, settings: MemorySettings, host_budget: float) -> str:
    need = estimate_host(shape, dataclasses.replace(settings, host_slot_budget=None)).peak_bytes
    return (
        f"offloaded, a batch of {settings.batch_tokens:,} tokens would hold {need / GIB:.1f} GiB of host memory, "
        f"{host_budget / GIB:.1f} GiB usable"
    )


def _nothing_fits(
    shape: ModelShape,
    cheapest: MemorySettings,
    available_bytes: float,
    longest_row: int,
    allow_qlora: bool,
    host_budget: float | None,
    forced: list[str],
) -> FitResult:
    """The result when no lever fits: why, and the longest row that would fit with every lever."""
    budget = usable(available_bytes)
    at_row = dataclasses.replace(cheapest, batch_tokens=max(longest_row, BATCH_MULTIPLE))
    floor = estimate_peak(shape, dataclasses.replace(cheapest, batch_tokens=BATCH_MULTIPLE))
    longest = largest_batch(shape, cheapest, budget, max(longest_row, BATCH_MULTIPLE), host_budget)
    if floor.peak_bytes > budget:
        reason = (
            f"even a {BATCH_MULTIPLE}-token batch with every memory lever needs {floor.peak_gib:.1f} GiB, more "
            f"than the {budget / GIB:.1f} GiB usable of {available_bytes / GIB:.1f} GiB"
            + (
                ""
                if allow_qlora or cheapest.qlora or cheapest.cpu
                else "; QLoRA (lora.qlora = true) would shrink the weights"
            )
        )
    else:
        reason = (
            f"a batch holding the longest row ({longest_row:,} tokens) needs "
            f"{estimate_peak(shape, at_row).peak_gib:.1f} GiB with every memory lever, more than the "
            f"{budget / GIB:.1f} GiB usable; rows up to {longest:,} tokens would fit (data.max_length)"
        )
    if forced:
        reason += "; " + forced[0]
    return FitResult(
        False, cheapest, estimate_peak(shape, at_row), available_bytes, reason=reason, largest_max_length=longest
    )

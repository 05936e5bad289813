"""Auto-fit's decisions: keep what fits, then the cheapest levers, then a smaller batch, QLoRA only when allowed,
never offload on unified memory, and say what the longest row could be when nothing fits."""

from __future__ import annotations

import dataclasses

from hone.core.memory.estimate import GIB, MemorySettings, estimate_peak
from hone.core.memory.fit import HEADROOM, auto_fit, largest_batch
from hone.core.memory.shape import ModelShape
from hone.core.models.shapes import make_config

QWEN3_8B = ModelShape.from_config(make_config("dense-8b"))
QWEN3_06B = ModelShape.from_config(make_config("dense-0.6b"))
GPU_CHECKPOINTS = MemorySettings(batch_tokens=16384, checkpoint="gpu", host_embeddings=False, host_lm_head=False)


def test_a_run_that_fits_is_left_alone():
    fit = auto_fit(QWEN3_06B, MemorySettings(batch_tokens=8192), 24 * GIB, 2048)
    assert fit.fits and fit.changes == () and fit.settings.batch_tokens == 8192


def test_cheap_levers_come_before_a_smaller_batch():
    need = estimate_peak(QWEN3_8B, GPU_CHECKPOINTS).peak_bytes
    levers_on = estimate_peak(QWEN3_8B, MemorySettings(batch_tokens=16384, checkpoint="offload-double")).peak_bytes
    available = (levers_on + (need - levers_on) / 2) / (1 - HEADROOM)  # between the two
    fit = auto_fit(QWEN3_8B, GPU_CHECKPOINTS, available, 2048)
    assert fit.fits and fit.settings.batch_tokens == 16384
    assert fit.changes[0] == "vocabulary tables in host memory"
    assert fit.estimate.peak_bytes <= available * (1 - HEADROOM)


def test_then_the_largest_batch_that_fits():
    fit = auto_fit(QWEN3_8B, MemorySettings(batch_tokens=16384), 19 * GIB, 2048)
    assert fit.fits and 2048 <= fit.settings.batch_tokens < 16384
    assert fit.changes[-1].startswith(f"batch of {fit.settings.batch_tokens:,} tokens")
    one_more = MemorySettings(batch_tokens=fit.settings.batch_tokens + 256, checkpoint=fit.settings.checkpoint)
    assert estimate_peak(QWEN3_8B, one_more).peak_bytes > 19 * GIB * (1 - HEADROOM)


def test_qlora_only_when_allowed():
    refused = auto_fit(QWEN3_8B, MemorySettings(batch_tokens=4096), 8 * GIB, 4096)
    assert not refused.fits and "QLoRA (lora.qlora = true) would shrink the weights" in refused.reason
    allowed = auto_fit(QWEN3_8B, MemorySettings(batch_tokens=4096), 8 * GIB, 4096, allow_qlora=True)
    assert allowed.fits and allowed.settings.qlora and "base weights in 4-bit (QLoRA)" in allowed.changes


def test_unified_memory_never_offloads():
    fit = auto_fit(QWEN3_8B, GPU_CHECKPOINTS, 18 * GIB, 2048, unified=True)
    assert fit.settings.checkpoint == "gpu"
    assert not any("offload" in change for change in fit.changes)


def test_a_row_too_long_names_the_longest_that_fits():
    fit = auto_fit(QWEN3_06B, MemorySettings(batch_tokens=65536), 3 * GIB, 65536)
    assert not fit.fits and "rows up to" in fit.reason
    assert 0 < fit.largest_max_length < 65536
    assert largest_batch(QWEN3_06B, fit.settings, 3 * GIB * (1 - HEADROOM), 65536) == fit.largest_max_length


# The default config on the CPU: float32, no GPU paths, checkpointing off.
CPU_DEFAULT = MemorySettings(
    batch_tokens=8192,
    weight_bytes=4,
    checkpoint="off",
    host_embeddings=False,
    host_lm_head=False,
    tiled_mlp=False,
    kernels=False,
    cpu=True,
)


def test_a_cpu_run_counts_its_resident_memory_beyond_its_tensors():
    from hone.core.memory.estimate import CPU_RESIDENT_FACTOR

    estimate = estimate_peak(QWEN3_06B, CPU_DEFAULT)
    tensors = sum(p.bytes for p in estimate.parts if p.name != "process and allocator")
    assert estimate.part("process and allocator") == (CPU_RESIDENT_FACTOR - 1) * tensors
    assert estimate.part("allocator slack") == 0


def test_on_the_cpu_recompute_comes_first_then_a_smaller_batch_and_never_a_gpu_lever():
    recompute = dataclasses.replace(CPU_DEFAULT, checkpoint="gpu")
    need_off, need_on = (estimate_peak(QWEN3_06B, s).peak_bytes for s in (CPU_DEFAULT, recompute))
    fit = auto_fit(QWEN3_06B, CPU_DEFAULT, (need_on + need_off) / 2 / (1 - HEADROOM), 2048)  # 16 GB laptop-like
    assert fit.fits and fit.settings == recompute and fit.changes == ("activation checkpointing (recompute)",)
    small = auto_fit(QWEN3_06B, CPU_DEFAULT, need_on * 0.8 / (1 - HEADROOM), 2048)
    assert small.fits and small.settings.checkpoint == "gpu" and 2048 <= small.settings.batch_tokens < 8192
    assert not (small.settings.host_embeddings or small.settings.tiled_mlp or small.settings.qlora)
    none = auto_fit(QWEN3_06B, CPU_DEFAULT, 1 * GIB, 2048, allow_qlora=True)
    assert not none.fits and not none.settings.qlora and "QLoRA" not in none.reason

"""Host memory in the plan: what offloaded checkpoints and host vocabulary tables hold, and auto-fit keeping the
layer inputs the host cannot hold on the GPU (the last ones, as the checkpointer does, or all of them)."""

from __future__ import annotations

import dataclasses

import pytest

from hone.core.machine.pinned_memory import pinned_slot_bytes
from hone.core.memory.estimate import GIB, MemorySettings, estimate_host, estimate_peak, offloaded_layers
from hone.core.memory.fit import HEADROOM, auto_fit
from hone.core.memory.shape import ModelShape
from hone.core.models.shapes import make_config

QWEN3_8B = ModelShape.from_config(make_config("dense-8b"))
LONG = 393_216  # a 384K-token row


def test_offloaded_checkpoints_hold_one_pinned_slot_per_layer():
    settings = MemorySettings(batch_tokens=LONG, checkpoint="offload-double")
    host = estimate_host(QWEN3_8B, settings)
    row = LONG * QWEN3_8B.hidden * 2  # one bf16 layer input: 3 GiB, registered as it is (not a 4 GiB block)
    assert row == 3 * GIB and pinned_slot_bytes(row) == row
    assert host.part("offloaded checkpoints") == QWEN3_8B.layers * 3 * GIB
    table = QWEN3_8B.vocab * QWEN3_8B.hidden * 2
    assert host.part("vocabulary tables") == (table if QWEN3_8B.tied_embeddings else 2 * table)
    on_gpu = estimate_host(QWEN3_8B, dataclasses.replace(settings, checkpoint="gpu", host_embeddings=False))
    assert on_gpu.part("offloaded checkpoints") == 0


def test_a_host_that_holds_the_checkpoints_changes_nothing():
    settings = MemorySettings(batch_tokens=LONG, checkpoint="offload-double")
    need = estimate_host(QWEN3_8B, settings).peak_bytes
    fit = auto_fit(QWEN3_8B, settings, 140 * GIB, LONG, host_available=need / (1 - HEADROOM) + GIB)
    assert fit.fits and fit.changes == () and fit.settings.checkpoint == "offload-double"


def test_a_host_too_small_for_one_input_keeps_every_checkpoint_on_the_gpu_and_says_so():
    settings = MemorySettings(batch_tokens=16384, checkpoint="offload-double")
    tables = estimate_host(QWEN3_8B, dataclasses.replace(settings, checkpoint="gpu")).peak_bytes
    host = (tables + 64 * 2**20) / (1 - HEADROOM)  # room for the tables and half a 128 MiB layer input
    fit = auto_fit(QWEN3_8B, settings, 140 * GIB, 16384, host_available=host)
    assert fit.fits and fit.settings.checkpoint == "gpu"
    assert fit.changes[0].startswith("checkpoints kept on the GPU: offloaded, a batch of 16,384 tokens would hold")
    assert 'speed.checkpoint="gpu"' in fit.assignments(settings)


def test_the_inputs_past_what_the_host_holds_stay_on_the_gpu_and_the_plan_counts_them_there():
    settings = MemorySettings(batch_tokens=LONG, checkpoint="offload-double")
    tables = estimate_host(QWEN3_8B, dataclasses.replace(settings, checkpoint="gpu")).peak_bytes
    host = (tables + 30.5 * GIB) / (1 - HEADROOM)  # slots for 10 inputs of 3 GiB
    fit = auto_fit(QWEN3_8B, settings, 200 * GIB, LONG, host_available=host)  # 26 inputs more on the GPU fit
    assert fit.fits and fit.settings.checkpoint == "offload-double" and fit.assignments(settings) == []
    assert offloaded_layers(QWEN3_8B, fit.settings) == 10
    assert fit.changes == ()  # nothing for the user to change: the checkpointer keeps them there by itself
    assert fit.notes[0].startswith("26 of 36 layer inputs kept on the GPU: offloaded, a batch of 393,216 tokens")
    everything_offloaded = estimate_peak(QWEN3_8B, settings)
    assert fit.estimate.part("checkpoints") == everything_offloaded.part("checkpoints") + 26 * 3 * GIB
    assert estimate_host(QWEN3_8B, fit.settings).part("offloaded checkpoints") == 10 * 3 * GIB
    assert estimate_host(QWEN3_8B, fit.settings).peak_bytes <= host * (1 - HEADROOM)


def test_without_the_host_the_long_row_does_not_fit_and_the_reason_names_host_memory():
    settings = MemorySettings(batch_tokens=LONG, checkpoint="offload-double")
    gpu_only = auto_fit(QWEN3_8B, settings, 80 * GIB, LONG)  # the plan as it was: host memory not counted
    assert gpu_only.fits and gpu_only.settings.checkpoint.startswith("offload")
    fit = auto_fit(QWEN3_8B, settings, 80 * GIB, LONG, host_available=64 * GIB)
    kept = estimate_peak(QWEN3_8B, dataclasses.replace(settings, checkpoint="gpu")).peak_bytes
    assert kept > 80 * GIB * (1 - HEADROOM)  # 36 layer inputs of 3 GiB on the GPU do not fit in 80 GiB
    assert not fit.fits and "of host memory, 54.4 GiB usable" in fit.reason  # 64 GiB less the headroom
    assert fit.largest_max_length < LONG


@pytest.mark.parametrize("host", [None, 8 * GIB])
def test_a_gpu_checkpoint_run_ignores_the_host(host):
    settings = MemorySettings(batch_tokens=8192, checkpoint="gpu")
    fit = auto_fit(QWEN3_8B, settings, 80 * GIB, 8192, host_available=host)
    assert fit.fits and fit.changes == ()


def test_a_preference_run_plans_for_a_pair_of_the_longest_rows():
    from hone.core.config import RunConfig
    from hone.core.memory.run_plan import longest_unit

    sft = RunConfig.from_dict({"data": {"max_length": 2048}, "train": {"batch_tokens": 8192}})
    dpo = RunConfig.from_dict({"data": {"max_length": 2048}, "train": {"batch_tokens": 8192, "method": "dpo"}})
    assert (longest_unit(sft), longest_unit(dpo)) == (2048, 4096)

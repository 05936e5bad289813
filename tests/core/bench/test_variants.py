"""The table of Hone runs: what applies to which model, and why a run is skipped in this build or here."""

from __future__ import annotations

import dataclasses

import torch

from hone.core.bench.hone_runner import not_wired
from hone.core.bench.variants import BASE, VARIANTS, Variant, applies, speed_config, speed_settings, unavailable
from hone.core.config import SpeedConfig


def variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def test_names_are_unique_and_base_switches_every_path_off():
    names = [v.name for v in VARIANTS]
    assert len(names) == len(set(names))
    config = speed_config(variant("hone-base"))
    assert (config.attention, config.loss, config.checkpoint, config.moe_backend, config.kernels, config.compile) == (
        "hf", "plain", "gpu", "eager", False, False)
    assert speed_settings(variant("loss-chunked")) == {**BASE, "loss": "chunked"}


def test_moe_backends_only_apply_to_moe_models():
    assert not applies(variant("moe-torch"), is_moe=False) and applies(variant("moe-torch"), is_moe=True)
    assert applies(variant("all"), is_moe=False) and applies(variant("all"), is_moe=True)


def test_cuda_paths_packages_and_unknown_settings_are_skipped_with_a_reason():
    assert unavailable(variant("attn-varlen"), "cpu") == "needs a CUDA GPU"
    assert unavailable(variant("attn-varlen"), "cuda") is None
    assert unavailable(variant("loss-chunked"), "cpu") is None
    missing = Variant("x", {}, "", needs=("module:hone_no_such_package",))
    assert unavailable(missing, "cpu") == "the hone_no_such_package package is not installed"
    future = Variant("x", {"offload_prefetch": 2}, "")
    assert "SpeedConfig has no field 'offload_prefetch'" in unavailable(future, "cpu")
    unknown_mode = Variant("x", {"checkpoint": "offload-triple"}, "")
    assert "offload-triple" in unavailable(unknown_mode, "cpu")


def test_every_variant_uses_fields_this_build_knows():
    fields = {f.name for f in dataclasses.fields(SpeedConfig)}
    assert all(set(v.overrides) <= fields for v in VARIANTS)


def test_a_single_path_variant_whose_path_is_not_wired_is_recognized():
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert "speed.kernels is not wired" in not_wired(variant("kernels"), {"attention": "sdpa"}, plain)
    assert not_wired(variant("kernels"), {"kernels": "triton: 28 norms"}, plain) is None
    assert not_wired(variant("kernels"), {"fused kernels": "triton"}, plain) is None
    assert "speed.compile is not wired" in not_wired(variant("compile"), {}, plain)
    plain[0].compile(backend="eager")  # what regional compilation does to each block; nothing is traced yet
    assert not_wired(variant("compile"), {}, plain) is None
    reason = not_wired(variant("ckpt-offload"), {"checkpoint": "gpu: recompute each decoder layer"})
    assert "speed.checkpoint = offload is not wired" in reason
    assert not_wired(variant("ckpt-offload"), {"checkpoint": "offload: one pinned buffer"}) is None
    assert not_wired(variant("all"), {}) is None  # "all" runs with whatever paths exist


def test_a_variant_whose_path_is_gpu_only_needs_cuda():
    """Fused kernels (and the MLP tiling they do), offloaded checkpoints, compilation and the host vocabulary
    tables exist only on a GPU: a variant that exists to measure one of them is skipped on a CPU, never run as
    a copy of `all` and reported ok."""
    gpu_only = []
    for v in VARIANTS:
        o = v.overrides
        if (("kernels" in v.focus and o.get("kernels")) or str(o.get("checkpoint", "")).startswith("offload")
                or o.get("compile") or o.get("host_embeddings") is False or o.get("host_lm_head") is False
                or "tiled_mlp" in o):
            gpu_only.append(v.name)
            assert unavailable(v, "cpu") == "needs a CUDA GPU", v.name
    assert {"kernels", "all-untiled", "ckpt-offload", "compile", "all-embed-gpu", "all-head-gpu"} <= set(gpu_only)
    assert unavailable(variant("all"), "cpu") is None and unavailable(variant("hone-base"), "cpu") is None


def test_a_path_the_run_reports_off_is_not_taken_for_wired():
    """The kernels entry of a CPU run says "off: ..." (its key names the path): the run measures nothing new."""
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    off = {"kernels": "off: Hone's fused kernels need an NVIDIA GPU", "attention": "sdpa: one mask"}
    assert not_wired(variant("kernels"), off, plain) == (
        "speed.kernels is off in this run: Hone's fused kernels need an NVIDIA GPU")
    assert not_wired(variant("kernels"), {"kernels": "off"}, plain) == "speed.kernels is off in this run: off"


def test_layer_groups_the_run_does_not_apply_are_recognized():
    cpu = {"checkpoint": "off: on the CPU memory is plentiful and recompute costs a third more time"}
    reason = not_wired(variant("all-groups-4k"), cpu)
    assert reason == ("speed.layer_group_tokens = 4096 is not in effect in this run (it reports checkpoint: off: on "
                      "the CPU memory is plentiful and recompute costs a third more time)")
    grouped = {"checkpoint": "gpu: recompute each decoder layer; packed layers back-propagated in groups of whole "
                             "sequences (at most 4096 tokens)"}
    assert not_wired(variant("all-groups-4k"), grouped) is None



def test_all_without_checkpointing_is_all_with_only_checkpointing_off():
    assert speed_settings(variant("all-ckpt-off")) == {**speed_settings(variant("all")), "checkpoint": "off"}

"""The table of Hone runs: what applies to which model, and why a run is skipped in this build or here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from hone.core.bench.hone_runner import not_wired
from hone.core.bench.variants import (
    ALL_ON,
    BASE,
    VARIANTS,
    Variant,
    applies,
    bench_variants,
    custom_variant,
    speed_config,
    speed_settings,
    unavailable,
)
from hone.core.config import SpeedConfig
from hone.core.errors import ConfigError

EXPERIMENTS = Path(__file__).resolve().parents[3] / "docs" / "performance" / "experiments.md"


def variant(name: str) -> Variant:
    return next(v for v in VARIANTS if v.name == name)


def documented_runs() -> dict[str, str]:
    """name -> --run spec, from the table of docs/performance/experiments.md."""
    rows = re.findall(r"^\| `([^`]+)`[^|]* \| `([^`]+)`", EXPERIMENTS.read_text(encoding="utf-8"), flags=re.M)
    return {name: spec for name, spec in rows}


def test_the_listed_runs_are_the_choices_a_user_makes():
    """Each path alone, every path on, and the defaults the README weighs against another choice; combinations and
    sweeps are --run runs (docs/performance/experiments.md)."""
    assert [v.name for v in VARIANTS] == [
        "hone-base",
        "attn-varlen",
        "attn-flash",
        "attn-sdpa",
        "loss-chunked",
        "ckpt-off",
        "ckpt-offload",
        "ckpt-offload-double",
        "moe-grouped_mm",
        "moe-triton",
        "moe-torch",
        "kernels",
        "compile",
        "all",
        "all-spare",
        "all-graphs-off",
        "all-lean",
        "all-long-rows-recompute",
        "all-ckpt-off",
    ]
    single = [v for v in VARIANTS if v.name not in ("hone-base",) and not v.name.startswith("all")]
    assert all(len(v.overrides) == 1 and not v.train for v in single), [v.name for v in single]


def test_names_are_unique_and_base_switches_every_path_off():
    names = [v.name for v in VARIANTS]
    assert len(names) == len(set(names))
    config = speed_config(variant("hone-base"))
    assert (config.attention, config.loss, config.checkpoint, config.moe_backend, config.kernels, config.compile) == (
        "hf",
        "plain",
        "gpu",
        "eager",
        False,
        False,
    )
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
    a copy of `all` and reported ok. The --run runs of docs/performance/experiments.md included."""
    gpu_only = []
    for v in bench_variants(list(documented_runs().values())):
        o = v.overrides
        if (
            ("kernels" in v.focus and o.get("kernels"))
            or str(o.get("checkpoint", "")).startswith("offload")
            or o.get("compile")
            or o.get("host_embeddings") is False
            or o.get("host_lm_head") is False
            or "tiled_mlp" in o
        ):
            gpu_only.append(v.name)
            assert unavailable(v, "cpu") == "needs a CUDA GPU", v.name
    assert {"kernels", "all-untiled", "ckpt-offload", "compile", "all-embed-gpu", "all-head-gpu"} <= set(gpu_only)
    assert unavailable(variant("all"), "cpu") is None and unavailable(variant("hone-base"), "cpu") is None


def test_a_path_the_run_reports_off_is_not_taken_for_wired():
    """The kernels entry of a CPU run says "off: ..." (its key names the path): the run measures nothing new."""
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    off = {"kernels": "off: Hone's fused kernels need an NVIDIA GPU", "attention": "sdpa: one mask"}
    assert not_wired(variant("kernels"), off, plain) == (
        "speed.kernels is off in this run: Hone's fused kernels need an NVIDIA GPU"
    )
    assert not_wired(variant("kernels"), {"kernels": "off"}, plain) == "speed.kernels is off in this run: off"


def test_layer_groups_the_run_does_not_apply_are_recognized():
    groups_4k = custom_variant("all-groups-4k=all,speed.layer_group_tokens=4096")
    cpu = {"checkpoint": "off: on the CPU memory is plentiful and recompute costs a third more time"}
    reason = not_wired(groups_4k, cpu)
    assert reason == (
        "speed.layer_group_tokens = 4096 is not in effect in this run (it reports checkpoint: off: on "
        "the CPU memory is plentiful and recompute costs a third more time)"
    )
    grouped = {
        "checkpoint": "gpu: recompute each decoder layer; packed layers back-propagated in groups of whole "
        "sequences (at most 4096 tokens)"
    }
    assert not_wired(groups_4k, grouped) is None


def test_all_without_checkpointing_is_all_with_only_checkpointing_off():
    assert speed_settings(variant("all-ckpt-off")) == {**speed_settings(variant("all")), "checkpoint": "off"}


def test_a_run_of_ones_own_is_its_start_with_the_settings_changed():
    groups = custom_variant("all-groups-4k=all, speed.layer_group_tokens=4096")
    assert groups.overrides == {**ALL_ON, "layer_group_tokens": 4096}  # the text "4096" made the field's int
    assert speed_settings(groups) == {**speed_settings(variant("all")), "layer_group_tokens": 4096}
    assert (groups.needs, groups.focus, groups.train, groups.per_layer_metadata) == ((), ("checkpoint",), {}, False)
    assert groups.description == "all, with speed.layer_group_tokens = 4096"

    per_layer = custom_variant("varlen-per-layer=attn-varlen,bench.per_layer_metadata=true")
    assert per_layer.overrides == {"attention": "varlen"} and per_layer.per_layer_metadata is True
    assert (per_layer.needs, per_layer.focus) == (("cuda",), ("attention",))  # what attn-varlen needs and measures

    lean = custom_variant("lean-offload=all-lean,speed.checkpoint=offload,train.optimizer=adamw8bit")
    assert lean.train == {"optimizer": "adamw8bit"} and lean.overrides == {**ALL_ON, "checkpoint": "offload"}
    assert lean.needs == ("cuda",) and unavailable(lean, "cpu") == "needs a CUDA GPU"

    assert custom_variant("head=all,speed.host_lm_head=false").needs == ("cuda",)
    assert custom_variant("flash=hone-base,speed.attention=flash").needs == ("module:flash_attn", "cuda")
    torch_experts = custom_variant("experts=all,speed.moe_backend=torch")
    assert torch_experts.needs == ("moe",) and not applies(torch_experts, is_moe=False)
    assert custom_variant("sdpa-loss=attn-sdpa,speed.loss=chunked").needs == ()
    assert unavailable(groups, "cpu") is None


def test_every_run_the_performance_pages_name_is_documented_as_a_run():
    documented = documented_runs()
    assert {"all-untiled", "all-head-gpu", "all-embed-gpu", "all-ckpt-gpu", "all-offload", "all-offload-double"} <= set(
        documented
    )
    for name, spec in documented.items():
        assert custom_variant(spec).name == name
    assert len(documented) == 18  # the runs that left `hone bench`'s list, each still a --run away


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("all", "is not of the form NAME=RUN,SETTING=VALUE"),
        ("=all", "is not of the form NAME=RUN,SETTING=VALUE"),
        ("a*=all", "is not of the form NAME=RUN,SETTING=VALUE"),
        ("x=no-such-run", "'no-such-run' is not a Hone run to start from"),
        ("all=hone-base", "'all' is already a run of this benchmark"),
        ("reference=all", "'reference' is already a run of this benchmark"),
        ("x=all,checkpoint=gpu", "'checkpoint=gpu' is not a setting"),
        ("x=all,speed.offload_prefetch=2", "speed.offload_prefetch is not a speed setting"),
        ("x=all,speed.checkpoint=offload-triple", "speed.checkpoint is 'offload-triple', which is not one of"),
        ("x=all,speed.layer_group_tokens=many", "speed.layer_group_tokens is 'many', which is not a valid int"),
        ("x=all,train.optimizer=sgd", "train.optimizer is 'sgd', which is not one of"),
        ("x=all,bench.per_layer_metadata=maybe", "bench.per_layer_metadata is 'maybe'"),
        ("x=all,speed.loss=plain,speed.loss=chunked", "speed.loss is given twice"),
    ],
)
def test_a_run_that_cannot_mean_a_run_is_refused_saying_why(spec, message):
    with pytest.raises(ConfigError) as error:
        custom_variant(spec)
    assert error.value.message.startswith(f"--run {spec!r}") and message in error.value.message
    assert error.value.advice


def test_two_runs_of_ones_own_need_two_names():
    with pytest.raises(ConfigError, match="'mine' is already a run of this benchmark"):
        bench_variants(["mine=all", "mine=hone-base"])
    assert [v.name for v in bench_variants(["a=all", "b=all"])[-2:]] == ["a", "b"]

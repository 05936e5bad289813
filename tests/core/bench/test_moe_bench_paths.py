"""The MoE benchmark's additions: ratios against the eager-experts reference and the `all-lean` run (adamw-bf16)."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from hone.core.bench.batch import make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.measure import RunResult
from hone.core.bench.report import compare, ratio_table
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.variants import VARIANTS, Variant, unavailable
from hone.core.cli import main


def test_runs_are_also_compared_with_the_eager_reference():
    runs = [
        RunResult("reference", "reference", tokens_per_s=20_000.0, peak_allocated_gib=26.0),
        RunResult("reference-eager", "reference", tokens_per_s=5_000.0, peak_allocated_gib=28.0),
        RunResult("all", "hone", tokens_per_s=55_000.0, peak_allocated_gib=12.0),
        RunResult("oom", "hone", status="oom"),
    ]
    compare(runs, "reference", "bfloat16", also=("reference-eager",))
    assert runs[2].speed_ratio == pytest.approx(2.75)
    assert runs[2].speed_ratios == {"reference-eager": pytest.approx(11.0)}
    assert runs[0].speed_ratios["reference-eager"] == pytest.approx(4.0) and runs[3].speed_ratios == {}
    console = Console(width=200, record=True)
    console.print(ratio_table(runs, "reference", "t"))
    text = console.export_text()
    assert "x eager" in text and "11.00" in text


def test_no_eager_column_without_an_eager_run():
    runs = [RunResult("reference", "reference", tokens_per_s=1.0), RunResult("all", "hone", tokens_per_s=2.0)]
    compare(runs, "reference", "bfloat16", also=("reference-eager",))
    console = Console(width=200, record=True)
    console.print(ratio_table(runs, "reference", "t"))
    assert "x eager" not in console.export_text() and runs[1].speed_ratios == {}


def test_all_lean_trains_with_the_flat_bf16_optimizer():
    lean = next(v for v in VARIANTS if v.name == "all-lean")
    runner = HoneRunner(
        lean,
        get_scenario("tiny-moe-qwen3"),
        None,
        make_batch(64, 100),
        lora_r=4,
        seed=0,
        dtype=torch.float32,
        device="cpu",
    )
    config = runner.run_config()
    assert config.train.optimizer == "adamw-bf16" and config.speed.moe_backend == "auto"
    assert "train.optimizer = 'adamw9'" in unavailable(Variant("x", {}, "", train={"optimizer": "adamw9"}), "cpu")


def test_tiny_moe_all_lean_matches_the_reference_and_reports_the_eager_ratio(tmp_path):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "tiny-moe-qwen3",
            "--tokens",
            "96",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--no-sync-count",
            "--only",
            "reference-eager,all-lean",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    lean = runs["all-lean"]
    assert lean["status"] == "ok", lean["details"]
    assert lean["overrides"]["train.optimizer"] == "adamw-bf16"
    assert lean["parity"] is True, (lean["loss_diff"], lean["grad_norm_rel_diff"])
    assert set(lean["speed_ratios"]) == {"reference-eager"} and lean["speed_ratios"]["reference-eager"] > 0

"""Ratios and parity against the baseline, the table, and the JSON record."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from hone.core.bench.measure import RunResult
from hone.core.bench.report import compare, notes, ratio_table, write_json


def run(name, kind="hone", **kw) -> RunResult:
    return RunResult(name=name, kind=kind, **kw)


def test_ratios_and_parity_against_the_baseline():
    base = run(
        "reference", "reference", tokens_per_s=1000.0, peak_allocated_gib=40.0, first_loss=12.0, first_grad_norm=2.0
    )
    fast = run("all", tokens_per_s=3500.0, peak_allocated_gib=2.0, first_loss=12.006, first_grad_norm=2.01)
    off = run("broken", tokens_per_s=900.0, peak_allocated_gib=40.0, first_loss=13.0, first_grad_norm=2.0)
    bad_grad = run("grad", tokens_per_s=900.0, peak_allocated_gib=40.0, first_loss=12.0, first_grad_norm=3.0)
    oom = run("oom", status="oom", reason="CUDA out of memory", peak_allocated_gib=139.0)
    compare([base, fast, off, bad_grad, oom], "reference", "bfloat16")
    assert base.speed_ratio == 1.0 and base.memory_ratio == 1.0 and base.parity is True
    assert fast.speed_ratio == pytest.approx(3.5) and fast.memory_ratio == pytest.approx(0.05)
    assert fast.loss_diff == pytest.approx(0.006) and fast.loss_rel_diff == pytest.approx(0.0005)
    assert fast.parity is True  # 0.05% loss and 0.5% gradient-norm difference are within bf16's 0.1% / 1%
    assert off.parity is False  # 8% off in loss
    assert bad_grad.parity is False and bad_grad.grad_norm_rel_diff == pytest.approx(0.5)
    assert oom.speed_ratio is None and oom.memory_ratio is None and oom.parity is None


def test_fp32_tolerance_is_tight_and_the_peer_is_judged_on_its_loss_only():
    base = run("reference", "reference", tokens_per_s=10.0, first_loss=10.0, first_grad_norm=1.0)
    close = run("hone-base", tokens_per_s=10.0, first_loss=10.0005, first_grad_norm=1.0)
    apart = run("attn-sdpa", tokens_per_s=10.0, first_loss=10.002, first_grad_norm=1.0)  # 2e-4
    peer = run("unsloth", "peer", tokens_per_s=10.0, first_loss=10.0, first_grad_norm=5.0)
    compare([base, close, apart, peer], "reference", "float32")
    assert close.parity is True  # 5e-5 relative: within fp32's 1e-4
    assert apart.parity is False  # 2e-4 relative: would pass in bf16 (1e-3), not in fp32
    assert peer.parity is True and peer.grad_norm_rel_diff is None


def test_a_run_training_other_parameters_has_no_parity_and_says_why():
    base = run(
        "reference", "reference", tokens_per_s=10.0, first_loss=10.0, first_grad_norm=1.0, trainable_params=166_000_000
    )
    same = run("all", tokens_per_s=30.0, first_loss=10.0, first_grad_norm=1.0, trainable_params=166_000_000)
    peer = run("unsloth", "peer", tokens_per_s=20.0, first_loss=10.0, trainable_params=2_200_000)
    compare([base, same, peer], "reference", "bfloat16")
    assert same.parity is True and same.parity_reason == ""
    assert peer.parity is False  # its loss agrees: LoRA B starts at zero whatever it is put on
    assert peer.parity_reason.startswith("trains 2,200,000 parameters, reference 166,000,000")
    assert notes([base, same, peer]) == [f"unsloth: parity no: {peer.parity_reason}"]
    console = Console(record=True, width=220)
    console.print(ratio_table([base, same, peer], "reference", "title"))
    text = console.export_text()
    assert "166.0M" in text and "2.2M" in text


def test_a_failed_baseline_leaves_every_ratio_empty():
    base = run("reference", "reference", status="oom")
    other = run("all", tokens_per_s=10.0, first_loss=1.0)
    compare([base, other], "reference", "bfloat16")
    assert other.speed_ratio is None and other.parity is None


def test_table_shows_every_run_and_notes_say_why_runs_did_not_finish():
    runs = [
        run("reference", "reference", tokens_per_s=10976.0, peak_allocated_gib=35.2, first_loss=12.0),
        run("ckpt-offload", status="skipped", reason="needs a CUDA GPU"),
        run("all", status="oom", reason="CUDA out of memory"),
    ]
    compare(runs, "reference", "bfloat16")
    console = Console(record=True, width=200)
    console.print(ratio_table(runs, "reference", "title"))
    text = console.export_text()
    assert "10,976" in text and "35.20" in text and "OOM" in text and "skipped" in text
    assert notes(runs) == ["ckpt-offload: skipped: needs a CUDA GPU", "all: oom: CUDA out of memory"]


def test_json_turns_non_finite_numbers_into_null(tmp_path):
    path = write_json(
        {"runs": [run("a", first_loss=math.nan, tokens_per_s=math.inf).to_dict()]}, tmp_path / "deep" / "b.json"
    )
    data = json.loads(path.read_text())
    assert data["runs"][0]["first_loss"] is None and data["runs"][0]["tokens_per_s"] is None
    assert not list(path.parent.glob("*.tmp"))


def test_the_reason_names_what_only_one_of_the_runs_adapts():
    base = run(
        "reference",
        "reference",
        tokens_per_s=10.0,
        first_loss=10.0,
        trainable_params=102_670_336,
        speed_paths={"adapted": "experts.down_proj, experts.gate_up_proj, kv_b_proj, o_proj, q_a_proj"},
    )
    peer = run(
        "unsloth",
        "peer",
        tokens_per_s=20.0,
        first_loss=10.0,
        trainable_params=67_764_224,
        speed_paths={"adapted": "experts.down_proj, experts.gate_up_proj, o_proj, shared_experts"},
    )
    compare([base, peer], "reference", "bfloat16")
    assert peer.parity is False
    assert peer.parity_reason.endswith(
        "not the same run; LoRA only in reference on: kv_b_proj, q_a_proj; LoRA only in unsloth on: shared_experts"
    ), peer.parity_reason

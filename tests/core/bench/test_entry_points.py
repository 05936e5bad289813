"""The `python -m` entry points of the benchmark package, at CPU sizes: attention alone (in attention_step, which
imports attention.py, not the other way round) and the MoE step plan (in step_plan, which imports anatomy)."""

from __future__ import annotations

import json

from hone.core.bench import attention_step
from hone.core.bench.meta_device import step_plan


def test_the_attention_entry_point_runs_attention_alone_and_writes_json(tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert attention_step.main(["--tokens", "300", "--json", str(out)]) == 0
    assert "attention alone, 300 tokens" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["steps"] == [] and data["attention"]["tokens"] == 300
    assert data["attention"]["max_abs_diff"] < 1e-4, "packed attention must equal the dense-mask path"


def test_the_step_plan_entry_point_prints_the_plan(capsys):
    assert step_plan.main(["--scenario", "tiny-moe-qwen3", "--backend", "grouped_mm"]) == 0
    out = capsys.readouterr().out
    assert "predicted step (roofline, H200)" in out and "experts GEMMs" in out

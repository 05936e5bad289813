"""`hone bench --host-profile`: one extra step under cProfile, summarized by function and by package."""

from __future__ import annotations

import cProfile
import json
import pstats

import hone.core.train.loss
from hone.core.bench.diagnostics.host_profile import package_of, summarize
from hone.core.cli import main


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_summary_ranks_functions_by_their_own_time_and_sums_packages():
    profiler = cProfile.Profile()
    profiler.enable()
    _busy(200_000)
    sorted(range(50_000), key=lambda i: -i)
    profiler.disable()
    summary = summarize(pstats.Stats(profiler), wall_s=1.0, top=3)
    assert summary["wall_ms"] == 1000.0 and len(summary["functions"]) == 3
    selfs = [row["self_ms"] for row in summary["functions"]]
    assert selfs == sorted(selfs, reverse=True) and selfs[0] > 0
    assert any("_busy" in row["function"] or "genexpr" in row["function"] for row in summary["functions"])
    assert summary["packages"]["builtins"] > 0 and summary["waiting_ms"] == 0.0


def test_package_names_come_from_the_path():
    assert package_of("/x/site-packages/torch/nn/modules/module.py") == "torch"
    assert package_of("/x/site-packages/transformers/models/qwen3/modeling_qwen3.py") == "transformers"
    assert package_of(hone.core.train.loss.__file__) == "hone"
    assert package_of("~") == "builtins"
    assert package_of("/usr/lib/python3.12/contextlib.py") == "other"


def test_bench_host_profile_option_prints_and_records_the_extra_step(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "tiny-dense",
            "--tokens",
            "48",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--only",
            "hone-base",
            "--baseline",
            "hone-base",
            "--micro",
            "off",
            "--no-sync-count",
            "--host-profile",
            "--profile-top",
            "5",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    assert "host profile of hone-base: one step" in capsys.readouterr().out
    summary = json.loads(out.read_text())["runs"][0]["host_profile"]
    assert len(summary["functions"]) == 5 and summary["function_calls"] > 100
    assert summary["packages"]["hone"] > 0 and summary["packages"]["torch"] > 0

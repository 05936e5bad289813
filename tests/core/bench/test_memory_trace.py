"""`hone bench --memory-trace`: the blocks alive at a step's peak, grouped by where they were allocated. The replay is
checked on hand-built allocator events (CPU machines record none); the option's wiring on a CPU run."""

from __future__ import annotations

import json

from hone.core.bench.diagnostics.memory_trace import GIB, peak_from_trace
from hone.core.cli import main


def _frame(file: str, line: int, name: str) -> dict:
    return {"filename": f"/site-packages/{file}", "line": line, "name": name}


TORCH = _frame("torch/nn/functional.py", 10, "linear")
LOSS = _frame("hone/core/loss.py", 120, "chunked_head_loss")
MLP = _frame("transformers/models/qwen3/modeling_qwen3.py", 60, "forward")


def test_the_peak_is_found_and_its_live_blocks_grouped_by_our_innermost_frame():
    events = [
        {"action": "alloc", "addr": 1, "size": GIB, "frames": [TORCH, MLP]},
        {"action": "alloc", "addr": 2, "size": GIB, "frames": [TORCH, MLP]},
        {"action": "free_requested", "addr": 1, "size": GIB},
        {"action": "free_completed", "addr": 1, "size": GIB},  # the same free, reported twice: counted once
        {"action": "alloc", "addr": 3, "size": 3 * GIB, "frames": [LOSS]},  # peak: 10 + 1 + 3 = 14 GiB
        {"action": "free_requested", "addr": 3, "size": 3 * GIB},
        {"action": "free_requested", "addr": 99, "size": 2 * GIB},  # a block from before the step
        {"action": "free_completed", "addr": 99, "size": 2 * GIB},
        {"action": "alloc", "addr": 4, "size": 4 * GIB, "frames": [LOSS]},  # 10 - 2 + 1 + 4 = 13: below the peak
    ]
    summary = peak_from_trace(events, before_bytes=10 * GIB)
    assert summary["peak_gib"] == 14 and summary["before_gib"] == 10 and summary["step_gib_at_peak"] == 4
    assert "loss.py:120 chunked_head_loss" in summary["peak_allocation"]
    assert [(row["gib"], row["blocks"]) for row in summary["sites"]] == [(3, 1), (1, 1)]
    assert "modeling_qwen3.py:60" in summary["sites"][1]["where"], "library frames name the site, not torch's"


def test_hones_own_frames_name_the_site_from_a_checkout_too():
    """An editable install runs Hone's modules from the checkout, whose paths hold no "/hone/": the site is still
    Hone's innermost frame, not the transformers frame that called it."""
    import hone.core.speed.attention.long_rows as long_rows

    ours = {"filename": long_rows.__file__, "line": 160, "name": "dense_causal"}
    call = _frame("transformers/models/qwen3/modeling_qwen3.py", 266, "forward")
    summary = peak_from_trace([{"action": "alloc", "addr": 1, "size": GIB, "frames": [TORCH, ours, call]}], 0)
    assert summary["sites"][0]["where"].startswith("long_rows.py:160 dense_causal < modeling_qwen3.py:266")


def test_bench_memory_trace_option_records_why_it_cannot_trace_on_a_cpu(tmp_path, capsys):
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
            "--memory-trace",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    why = "the allocator history needs a CUDA device"
    assert f"memory at the peak of hone-base: {why}" in capsys.readouterr().out
    assert json.loads(out.read_text())["runs"][0]["memory_trace"] == {"error": why}

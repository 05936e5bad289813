"""GPU: `hone bench vision-qwen2.5-vl` at 4 text layers (the scenario builds all 36): a Qwen2.5-VL-3B-shaped model
(random init) trains on mixed rows through Hone and through plain transformers + peft, and both report speed and
memory."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu


def test_vision_bench_runs_both_paths(tmp_path):
    import torch

    from hone.core.cli import main

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = tmp_path / "bench.json"
    tokenizer = ["--tokenizer", os.environ["HONE_TEST_TOKENIZER"]] if os.environ.get("HONE_TEST_TOKENIZER") else []
    # 5 optimizer steps per path, the first 2 untimed
    assert main(["bench", "vision-qwen2.5-vl", "--layers", "4", "--warmup", "2", "--steps", "3", "--tokens", "4096",
                 "--json", str(out), *tokenizer]) == 0
    data = json.loads(out.read_text())
    runs = {r["name"]: r for r in data["runs"]}
    hone, ref = runs["hone"], runs["reference"]
    for name, r in (("hone", hone), ("reference", ref)):
        assert r["status"] == "ok", f"{name}: {r['reason']}\n{r['details']}"
        assert r["tokens_per_s"] > 0 and r["peak_allocated_gib"] > 0, (name, r)
        losses = data["losses"][name]
        assert all(loss == loss for loss in losses), f"{name} losses not finite: {losses}"
    # the same data and model: the first losses agree to within the different batchings (packed vs padded)
    assert abs(hone["first_loss"] - ref["first_loss"]) / ref["first_loss"] < 0.15, data["losses"]
    assert hone["peak_allocated_gib"] <= ref["peak_allocated_gib"] * 1.2, (
        f"Hone peak {hone['peak_allocated_gib']:.1f} GiB vs {ref['peak_allocated_gib']:.1f}")

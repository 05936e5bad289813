"""GPU: a Qwen2.5-VL-3B-shaped model (random init, 4 text layers here; tools/vision_bench.py runs the full depth)
trains on mixed rows through Hone and through plain transformers + peft, and both report speed and memory."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_vision_bench_runs_both_paths(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    path = Path(__file__).parents[3] / "tools" / "vision_bench.py"
    spec = importlib.util.spec_from_file_location("vision_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    tokenizer = ["--tokenizer", os.environ["HONE_TEST_TOKENIZER"]] if os.environ.get("HONE_TEST_TOKENIZER") else []
    assert bench.main(["--layers", "4", "--steps", "5", "--batch-tokens", "4096", "--out", str(out), *tokenizer]) == 0
    results = json.loads(out.read_text())
    hone, ref = results["hone"], results["transformers+peft"]
    for name, r in (("hone", hone), ("reference", ref)):
        assert r["tokens_per_s"] > 0 and r["peak_gib"] > 0, (name, r)
        assert all(loss == loss for loss in r["losses"]), f"{name} losses not finite: {r['losses']}"
    # the same data and model: the first losses agree to within the different batchings (packed vs padded)
    assert abs(hone["losses"][0] - ref["losses"][0]) / ref["losses"][0] < 0.15, (hone["losses"], ref["losses"])
    assert hone["peak_gib"] <= ref["peak_gib"] * 1.2, f"Hone peak {hone['peak_gib']:.1f} GiB vs {ref['peak_gib']:.1f}"

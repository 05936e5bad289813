"""`hone demo`, `hone data` and `hone export` with a user mistake in their inputs: exit 2 at once, one error line and
advice naming the fix, nothing written to disk. Run as users run them: a `hone` subprocess in a temp dir, offline."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

# As in test_train_input_checks: Python, rich and the file checks take well under a second on an idle machine;
# importing torch and loading a model takes 10-40 s.
FAST_S = 6.0


def _hone(tmp_path, *argv: str):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HONE_CACHE": str(tmp_path / "cache")}
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    return out, time.monotonic() - start


def _row(question: str, answer: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})


def _run_folder(tmp_path, model: str, adapter: bool):
    """A run folder as `hone train` leaves it: config.toml, and adapter/ once the run saved one (whole files holding
    no tensors: the checks read only their headers)."""
    run = tmp_path / "runs" / "r1"
    (run / "adapter").mkdir(parents=True)
    (run / "config.toml").write_text(f'[model]\nname_or_path = "{model}"\n', encoding="utf-8")
    if adapter:
        (run / "adapter" / "adapter_config.json").write_text("{}", encoding="utf-8")
        (run / "adapter" / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return run


CASES = [
    (
        "demo missing model folder",
        ["demo", "--model", "./no-such-model"],
        "no-such-model does not exist",
        "give --model a local model folder",
    ),
    ("demo missing gguf", ["demo", "--model", "./weights/model.gguf"], "model.gguf does not exist", "check the path"),
    (
        "demo bundled typo",
        ["demo", "--model", "bundled:smollm2"],
        "bundled:smollm2 is not a bundled model",
        "bundled:smollm2-135m-instruct",
    ),
    (
        "demo unknown hub id offline",
        ["demo", "--model", "nobody-here/no-such-model-26"],
        "HF_HUB_OFFLINE",
        "give --model a local model folder",
    ),
    (
        "data check missing file",
        ["data", "check", "good.jsonl", "nowhere.jsonl"],
        "nowhere.jsonl does not exist",
        "check the file names",
    ),
    (
        "data check missing model",
        ["data", "check", "good.jsonl", "--model", "./no-such-model"],
        "no-such-model does not exist",
        "give --model",
    ),
    (
        "data check hub id offline",
        ["data", "check", "good.jsonl", "--model", "nobody-here/no-such-model-26"],
        "HF_HUB_OFFLINE",
        "give --model",
    ),
    (
        "data inspect missing file",
        ["data", "inspect", "nowhere.jsonl", "--model", "bundled:smollm2-135m-instruct"],
        "nowhere.jsonl does not exist",
        "check the file names",
    ),
    (
        "data inspect bundled typo",
        ["data", "inspect", "good.jsonl", "--model", "bundled:smollm2"],
        "is not a bundled model",
        "bundled:smollm2-135m-instruct",
    ),
    ("export missing run", ["export", "runs/no-such-run"], "no-such-run does not exist", "give the folder of a run"),
    ("export not a run", ["export", "."], "is not a run folder", "hone train"),
    (
        "export unknown format",
        ["export", "runs/r1", "--format", "safetensorz"],
        "unknown export format",
        "adapter, merged, gguf",
    ),
    ("export no adapter", ["export", "runs/r1"], "has no adapter to export", "hone train --resume"),
    ("export base model gone", ["export", "runs/r1", "--format", "merged"], "gone-model does not exist", "config.toml"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_input_mistake_exits_2_at_once_and_leaves_nothing(tmp_path, case):
    name, argv, message, advice = case
    (tmp_path / "good.jsonl").write_text(_row("q", "a") + "\n", encoding="utf-8")
    if argv[0] == "export":
        _run_folder(tmp_path, str(tmp_path / "gone-model"), adapter=name != "export no adapter")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out, elapsed = _hone(tmp_path, *argv)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("hone: error:") and message in lines[0], out.stderr
    assert lines[1].startswith("hone: advice:") and advice in lines[1], out.stderr
    assert len(lines) == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no runs/, cache or export
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"

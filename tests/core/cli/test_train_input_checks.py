"""`hone train` with a user mistake in its inputs: exit 2 at once, one error line and advice naming the fix, and
nothing written to disk (no run folder). Run as users run it: a `hone` subprocess on files in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hone.core.config import DEMO_TRAIN_DATA

# Longer than `hone train`'s own start (Python, rich, the config and the file checks: well under a second on an idle
# machine) with room for a loaded CI machine, and far shorter than loading torch and a model (10-40 s).
FAST_S = 6.0


def _train(tmp_path, *settings: str, env: dict | None = None):
    config = tmp_path / "run.toml"
    config.write_text(f'[output]\nruns_dir = "{(tmp_path / "runs").as_posix()}"\n', encoding="utf-8")
    args = [sys.executable, "-m", "hone.core.cli", "train", str(config)]
    for setting in settings:
        args += ["--set", setting]
    start = time.monotonic()
    out = subprocess.run(
        args, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **(env or {})}, timeout=120
    )
    return out, time.monotonic() - start


CASES = [
    (
        "missing model folder",
        ["model.name_or_path=./no-such-model"],
        "no-such-model does not exist",
        "local model folder",
    ),
    ("missing gguf", ["model.name_or_path=./weights/model.gguf"], "model.gguf does not exist", "check the path"),
    ("missing data file", ["data.train=['nowhere.jsonl']"], "nowhere.jsonl does not exist", "data.train"),
    (
        "max_length over batch_tokens",
        ["data.max_length=4096", "train.batch_tokens=1024"],
        "data.max_length (4096) is larger than train.batch_tokens (1024)",
        "raise train.batch_tokens",
    ),
    (
        "bundled typo",
        ["model.name_or_path=bundled:smollm2"],
        "bundled:smollm2 is not a bundled model",
        "bundled:smollm2-135m-instruct",
    ),
    (
        "bundled data typo",
        ["data.train=['bundled:json_extract/trian.jsonl']"],
        "is not a bundled file",
        DEMO_TRAIN_DATA,
    ),
    (
        "unknown hub id offline",
        ["model.name_or_path=nobody-here/no-such-model-26"],
        "HF_HUB_OFFLINE",
        "local model folder",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_input_mistake_exits_2_at_once_and_leaves_nothing(tmp_path, case):
    _, settings, message, advice = case
    out, elapsed = _train(tmp_path, *settings, env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("hone: error:") and message in lines[0], out.stderr
    assert lines[1].startswith("hone: advice:") and advice in lines[1], out.stderr
    assert len(lines) == 2 and "Traceback" not in out.stderr and "Retry" not in out.stderr
    assert not (tmp_path / "runs").exists()
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"

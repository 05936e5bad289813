"""`hone train --resume` as a user types it: each --set is applied or refused with the key and why, changed data is
refused with the file and the ways on, and a refusal is exit 2 with the run folder untouched."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config


def _hone(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "400"},
    )  # one console line per notice


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir, chat_files):
    """A finished 3-step run (lr 1e-3, one warmup step, cosine) on a copy of the chat data; each test copies it."""
    root = tmp_path_factory.mktemp("resume-cli")
    train = root / "train.jsonl"
    shutil.copy(chat_files[0], train)
    config = make_tiny_config(tiny_model_dir("tiny-dense"), (train, chat_files[1]), root / "runs", "output.name=r")
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return root / "runs" / "r", train


@pytest.fixture
def run_copy(finished_run, tmp_path):
    run_dir, train = finished_run
    copy = tmp_path / "r"
    shutil.copytree(run_dir, copy)
    return copy, train


def test_a_change_that_moves_the_data_order_is_refused_with_exit_2_and_nothing_written(run_copy):
    run_dir, _ = run_copy
    before = _snapshot(run_dir)
    out = _hone("train", "--resume", str(run_dir), "--set", "train.batch_tokens=512", "--set", "train.lr=1e-4")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "train.batch_tokens 256 → 512" in out.stderr and "packed" in out.stderr
    assert "--set train.batch_tokens=512" in out.stderr  # how to start a new run with it instead
    assert "train.lr" not in out.stderr.split("advice")[0]  # lr alone could be applied: not among the refused
    assert "Traceback" not in out.stderr
    assert _snapshot(run_dir) == before


def test_changed_training_data_is_refused_naming_the_file(run_copy):
    run_dir, train = run_copy
    before = _snapshot(run_dir)
    original = train.read_bytes()
    try:
        train.write_bytes(original + original[: original.index(b"\n") + 1])  # one row more
        out = _hone("train", "--resume", str(run_dir), "--set", "train.max_steps=5")
    finally:
        train.write_bytes(original)
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(train) in out.stderr and "changed" in out.stderr
    assert "--data-changed restart-epoch" in out.stderr and "--data-changed continue" in out.stderr
    assert _snapshot(run_dir) == before


@pytest.mark.slow
def test_resume_with_a_new_lr_trains_with_it_and_says_so(run_copy):
    run_dir, _ = run_copy
    out = _hone("train", "--resume", str(run_dir), "--set", "train.lr=1e-4", "--set", "train.max_steps=5")
    assert out.returncode == 0, out.stderr[-3000:]
    shown = out.stdout + out.stderr
    assert "train.lr 0.001 → 0.0001" in shown and "train.max_steps 3 → 5" in shown
    lrs = {e.step: e.lr for e in read_events(run_dir) if isinstance(e, events.StepMetrics) and e.step > 3}

    def cosine(k):  # reference: one warmup step, then cosine over 5 steps, peak 1e-4
        return 1e-4 * 0.5 * (1 + math.cos(math.pi * (k - 1) / 4))

    assert lrs == pytest.approx({4: cosine(3), 5: cosine(4)}, rel=1e-9)
    assert RunConfig.load(run_dir / "config.toml").train.lr == 1e-4
    assert RunConfig.load(run_dir / "config.1.toml").train.lr == 1e-3
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_data_changed_without_resume_is_refused():
    out = _hone("train", "--data-changed", "continue", timeout=120)
    assert out.returncode == 2
    assert "--data-changed" in out.stderr and "--resume" in out.stderr

"""`hone train --rerun RUN_DIR`: a new run with the original's settings that says whether its first-step loss
matches and which recorded facts (provenance.json) differ."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hone.core import events
from hone.core.train.provenance import PROVENANCE_FILE
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config


def _hone(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "400"},
    )


def _first_loss(run_dir) -> float:
    return next(e.loss for e in read_events(run_dir) if isinstance(e, events.StepMetrics) and e.step == 1)


@pytest.fixture(scope="module")
def original(tmp_path_factory, tiny_model_dir, chat_files):
    """A finished 2-step run on the CPU, trained in this process."""
    root = tmp_path_factory.mktemp("rerun")
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, root / "runs", "output.name=r", "train.max_steps=2", "train.seed=11"
    )
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return root / "runs" / "r"


def test_the_run_records_what_it_was_made_from(original, tiny_model_dir):
    data = json.loads((original / PROVENANCE_FILE).read_text(encoding="utf-8"))
    import torch
    import transformers

    assert data["seed"] == 11 and data["device"] == "cpu" and data["gpu"] is None
    assert data["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert data["versions"]["transformers"] == transformers.__version__
    assert data["model"]["source"] == "folder" and len(data["model"]["fingerprint"]) == 64
    assert data["model"]["files"] >= 2  # the weights and the config that says how they load
    assert data["model"]["path"] == str(tiny_model_dir("tiny-dense").resolve())


@pytest.mark.slow
def test_rerun_reproduces_the_first_step_loss_exactly_and_names_what_differs(original, tmp_path):
    out = _hone("train", "--rerun", str(original), "--set", "train.max_steps=1")
    shown = out.stdout + out.stderr
    assert out.returncode == 0, shown[-3000:]
    rerun = original.parent / "r-2"  # a new folder beside the original; the original is untouched
    assert _first_loss(rerun) == _first_loss(original)
    assert f"first-step loss {_first_loss(original)!r} matches the original's" in shown
    assert "what differs from the original: nothing recorded" in shown
    log = (rerun / "train.log").read_text(encoding="utf-8")
    assert f"rerun of {original}: first-step loss" in log and "matches" in log
    assert json.loads((rerun / PROVENANCE_FILE).read_text(encoding="utf-8"))["seed"] == 11

    # An original made with other versions and another first loss: both said, with the numbers.
    edited = tmp_path / "edited"
    shutil.copytree(original, edited)
    facts = json.loads((edited / PROVENANCE_FILE).read_text(encoding="utf-8"))
    true_torch, facts["versions"]["torch"] = facts["versions"]["torch"], "1.0.0"
    (edited / PROVENANCE_FILE).write_text(json.dumps(facts), encoding="utf-8")
    lines = (edited / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        event = events.from_line(line.encode())
        if isinstance(event, events.StepMetrics) and event.step == 1:
            record = json.loads(line)
            record["loss"] = event.loss + 0.5
            lines[i] = json.dumps(record)
    (edited / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = _hone("train", "--rerun", str(edited), "--set", "train.max_steps=1")
    shown = out.stdout + out.stderr
    assert out.returncode == 0, shown[-3000:]
    assert f"differs from the original's {_first_loss(original) + 0.5!r}" in shown
    assert "by 0.5 (" in shown
    assert f"versions.torch: 1.0.0 → {true_torch}" in shown


def test_rerun_takes_no_config_and_needs_a_run_folder(original, tmp_path):
    out = _hone("train", "other.toml", "--rerun", str(original))
    assert out.returncode == 2 and "--rerun takes its settings from the run folder's config.toml" in out.stderr
    out = _hone("train", "--rerun", str(tmp_path))
    assert out.returncode == 2 and f"{tmp_path} is not a run folder (no config.toml)" in out.stderr

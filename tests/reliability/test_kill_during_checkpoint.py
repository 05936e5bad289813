"""kill -9 at every file-system change of a checkpoint save, and of a same-step rewrite: the run folder always holds
its newest complete checkpoint, and the resumed run ends with the losses and the adapter of a run never killed,
bit for bit.

A 2-step run on the tiny model saves step 1 (checkpoint_every = 1), then step 2 at the end and prunes step 1
(keep_checkpoints = 1). tests/reliability/fault_runner.py kills it at change k for every k the hook counts in a run
(HONE_FAULT_AT=k: the process SIGKILLs itself), then resumes it in a fresh process. The same-step rewrite is a run
stopped after its step-1 checkpoint, resumed and stopped again at once: the stop saves step 1 again over the complete
step 1 (a finished run is not resumed at its length, so this is how a same-step save happens).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hone.core import events
from hone.core.train.checkpoints import checkpoint_report
from hone.core.train.run_dir import read_events
from tests.core.conftest import make_tiny_config, write_rows

# slow: about 45 runs of the tiny model (~1.5 min of CPU); the default suite and .ci/run still run it.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the runner forks a process per run (POSIX)"),
]

RUNNER = Path(__file__).with_name("fault_runner.py")
SETTINGS = [
    "train.max_steps=2",
    "output.checkpoint_every=1",
    "output.keep_checkpoints=1",
    "data.max_length=128",
    "train.batch_tokens=128",
    "lora.dropout=0.1",  # dropout: the RNG states must come back too
    "data.eval=[]",
]


@pytest.fixture(scope="module")
def fault_runs(tmp_path_factory, tiny_model_dir):
    """The runner's work folder, with every scenario run."""
    from hone.core.demo.text_data import make_dataset

    work = tmp_path_factory.mktemp("faults")
    rows, _ = make_dataset(n_train=24, n_eval=4, seed=3)
    train = write_rows(work / "train.jsonl", rows)
    config = make_tiny_config(tiny_model_dir("tiny-dense"), (train, train), work / "unused", *SETTINGS)
    config.save(work / "run.toml")
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(work / "run.toml"), str(work), "save,rewrite"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return work


def _losses(run_dir: Path) -> dict[int, float]:
    steps = [e for e in read_events(run_dir) if isinstance(e, events.StepMetrics)]
    losses = {e.step: e.loss for e in steps}
    assert len(losses) == len(steps), f"{run_dir.name}: a step is in metrics.jsonl twice: {[e.step for e in steps]}"
    return losses


def _step(checkpoint: str | None) -> int:
    """A checkpoint folder's step: 2 for step-000002, 1 for .old-step-000001 (a same-step save's aside), 0 for none."""
    return int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0


def _chains(work: Path, scenario: str) -> list[tuple[int, dict]]:
    ops = int((work / f"{'reference' if scenario == 'save' else 'stopped-again'}.ops").read_text())
    missing = [k for k in range(1, ops + 1) if not (work / f"{scenario}-{k}.json").is_file()]
    assert not missing, f"{scenario}: no result for kills at {missing}"
    return [(k, json.loads((work / f"{scenario}-{k}.json").read_text())) for k in range(1, ops + 1)]


def _assert_like_the_reference(work: Path, run_dir: Path) -> None:
    reference = work / "reference"
    assert _losses(run_dir) == _losses(reference), run_dir.name
    adapter = "adapter/adapter_model.safetensors"
    assert (run_dir / adapter).read_bytes() == (reference / adapter).read_bytes(), run_dir.name
    complete, broken = checkpoint_report(run_dir)
    assert [p.name for p in complete] == ["step-000002"] and not broken, run_dir.name
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["step-000002"], f"{run_dir.name}: {left}"  # no half-written, set-aside or half-deleted folder
    weights = "checkpoints/step-000002/trainable.safetensors"
    assert (run_dir / weights).read_bytes() == (reference / weights).read_bytes(), run_dir.name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_a_kill_at_any_point_of_a_checkpoint_save_resumes_to_the_same_run(fault_runs):
    work = fault_runs
    chains = _chains(work, "save")
    assert len(chains) >= 12  # two saves (mkdir, 4 files, rename each) and a prune (rename, delete)
    found = []
    for k, result in chains:
        assert result["killed"] == -9, f"kill at change {k}: the run ended with {result['killed']}"
        assert not result["broken"], f"kill at change {k} left {result['broken']} ({result['after_kill']})"
        found.append(_step(result["newest"]))
        assert result["resumed"] == 0, f"the resume after a kill at change {k} failed"
        _assert_like_the_reference(work, work / f"save-{k}")
    # Once a checkpoint was complete, every later kill found one at least as new: never a moment without it.
    assert found == sorted(found), found
    assert set(found) == {0, 1, 2}, f"the kills did not hit every phase of the saves: {found}"


def test_a_kill_at_any_point_of_a_same_step_rewrite_keeps_the_step_and_resumes(fault_runs):
    work = fault_runs
    again = work / "stopped-again"
    finished = [e for e in read_events(again) if isinstance(e, events.RunFinished)]
    assert [(e.step, e.stopped) for e in finished] == [(1, True), (1, True)]
    assert [e.final_loss for e in finished] == [_losses(work / "reference")[1]] * 2  # not NaN on the resume
    chains = _chains(work, "rewrite")
    assert len(chains) >= 8  # mkdir, 4 files, set the old one aside, rename the new one in, delete the old
    for k, result in chains:
        assert result["killed"] == -9, f"kill at change {k}: the run ended with {result['killed']}"
        assert _step(result["newest"]) == 1 and not result["broken"], (
            f"kill at change {k} of the rewrite left {result['after_kill']}: {result['broken']}"
        )
        assert result["resumed"] == 0, f"the resume after a kill at change {k} failed"
        _assert_like_the_reference(work, work / f"rewrite-{k}")
    # The kill between the two renames: the old step-1 set aside, the new one not renamed in; found all the same.
    assert any(result["after_kill"] == [".old-step-000001", ".tmp-step-000001"] for _, result in chains)

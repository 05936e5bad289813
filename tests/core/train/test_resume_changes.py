"""Resuming with changed settings or changed data on a tiny model (CPU): a change is applied from the next step and
said, or the resume is refused before anything is written; the run folder says what was trained."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer


def _cosine(step: int, lr: float, warmup: int, total: int) -> float:
    """Reference: linear warmup, then cosine decay to 0, for 0-based optimizer step `step`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def _run(config: RunConfig, resume_dir=None, stop_after: int | None = None, **kwargs) -> list[events.Event]:
    """A CPU run's events; with `stop_after`, stopped (checkpoint and adapter saved) after that step."""
    control = RunControl()
    out = []
    for event in Trainer(config, control, resume_dir=resume_dir, device="cpu", **kwargs).run():
        out.append(event)
        if stop_after is not None and isinstance(event, events.StepMetrics) and event.step == stop_after:
            control.stop()
    assert not isinstance(out[-1], events.RunFailed), out[-1]
    return out


def _latest_state(run_dir) -> dict:
    newest = max((run_dir / "checkpoints").glob("step-*"), key=lambda p: p.name)
    return json.loads((newest / "state.json").read_text(encoding="utf-8"))


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_new_lr_and_more_steps_apply_from_the_next_step_and_the_folder_says_so(
    tiny_model_dir, chat_files, tiny_config, tmp_path
):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", "output.name=r")
    run_dir = tmp_path / "runs" / "r"
    first = _run(config)  # lr 1e-3, one warmup step, 3 steps, cosine; finishes with a checkpoint at step 3
    assert [e.lr for e in first if isinstance(e, events.StepMetrics)] == pytest.approx(
        [_cosine(k, 1e-3, 1, 3) for k in range(3)]
    )

    wanted = RunConfig.load(run_dir / "config.toml").with_overrides(["train.lr=1e-4", "train.max_steps=6"])
    after = _run(wanted, resume_dir=run_dir)
    steps = [e for e in after if isinstance(e, events.StepMetrics)]
    assert [s.step for s in steps] == [4, 5, 6]
    # Before: the restored scheduler kept the old peak (1e-3) while the new length (6 steps) was applied.
    assert [s.lr for s in steps] == pytest.approx([_cosine(k, 1e-4, 1, 6) for k in (3, 4, 5)], rel=1e-9)
    said = [e for e in after if isinstance(e, events.Notice) and e.topic == "resume"]
    lr_notice = next(n for n in said if "train.lr" in n.message)
    assert lr_notice.level == "warning" and lr_notice.step == 4 and "3 → 6" in lr_notice.message
    assert any("config.1.toml" in n.message for n in said)

    assert RunConfig.load(run_dir / "config.toml") == wanted  # the folder says what is trained now
    assert RunConfig.load(run_dir / "config.1.toml") == config  # and what was trained before
    log = (run_dir / "train.log").read_text(encoding="utf-8")
    assert "warning: resume: " in log and "train.lr 0.001 → 0.0001" in log
    state = _latest_state(run_dir)
    assert state["step"] == 6 and state["total_steps"] == 6
    assert state["config"]["train"]["lr"] == 1e-4
    recorded = state["data"]["train"][0]
    assert recorded["size"] == chat_files[0].stat().st_size and recorded["sha256"] == _sha256(chat_files[0])
    assert state["data"]["eval"][0]["sha256"] == _sha256(chat_files[1])


def test_changed_training_data_is_refused_and_each_accepting_mode_does_what_it_says(
    tiny_model_dir, chat_files, tiny_config, tmp_path
):
    train = tmp_path / "train.jsonl"
    shutil.copy(chat_files[0], train)
    config = tiny_config(
        tiny_model_dir("tiny-dense"), (train, chat_files[1]), tmp_path / "runs", "output.name=r", "train.max_steps=20"
    )
    run_dir = tmp_path / "runs" / "r"
    before = _run(config, stop_after=2)  # a checkpoint at step 2: two packs of epoch 0 consumed
    old_progress = next(e.epoch for e in before if isinstance(e, events.StepMetrics) and e.step == 2)

    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join(lines[:18]), encoding="utf-8")  # six rows removed between the stop and the resume
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    summary = (run_dir / "run.json").read_bytes()

    refused = list(Trainer(config, resume_dir=run_dir, device="cpu").run())
    assert len(refused) == 1 and isinstance(refused[0], events.RunFailed)
    assert str(train) in refused[0].reason and "changed" in refused[0].reason
    assert "--data-changed restart-epoch" in refused[0].advice
    # Nothing written: the run stays "stopped" at step 2, its history as it was.
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics and (run_dir / "run.json").read_bytes() == summary
    assert not (run_dir / "config.1.toml").exists()

    other = tmp_path / "runs" / "r-continue"
    shutil.copytree(run_dir, other)
    restarted = _run(config, resume_dir=run_dir, stop_after=3, data_changed="restart-epoch")
    continued = _run(config, resume_dir=other, stop_after=3, data_changed="continue")
    for got, mode in ((restarted, "restart-epoch"), (continued, "continue")):
        warned = [e for e in got if isinstance(e, events.Notice) and e.topic == "resume" and e.level == "warning"]
        assert any(str(train) in n.message and mode in n.message for n in warned), warned
        assert next(e for e in got if isinstance(e, events.RunStarted)).resumed_from_step == 2
    # Epoch progress after step 3 is (packs consumed) / (packs per epoch of the new data): one pack when the epoch
    # started over, three when the position was kept.
    progress_restarted = next(e.epoch for e in restarted if isinstance(e, events.StepMetrics))
    progress_continued = next(e.epoch for e in continued if isinstance(e, events.StepMetrics))
    assert progress_continued == pytest.approx(3 * progress_restarted)
    assert progress_restarted < old_progress
    # From now on the checkpoints record the new data, so the next resume verifies against it.
    assert _latest_state(run_dir)["data"]["train"][0]["sha256"] == _sha256(train)
    assert _latest_state(run_dir)["position"] == 1
    assert isinstance(read_events(run_dir)[-1], events.RunFinished)
    _run(config, resume_dir=run_dir, stop_after=4)  # the new data is the run's data now: no flag needed

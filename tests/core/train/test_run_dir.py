"""The run folder as files: each step once in metrics.jsonl after a resume, whole lines after a kill, strict JSON
(null for a number that is not finite), and no folder left behind by an attempt that never started."""

from __future__ import annotations

import json
import math

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.run_dir import RunWriter, read_events, read_summary
from hone.core.train.trainer import Trainer


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as every JSON reader outside Python does."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _step(step: int, loss: float, grad_norm: float = 1.0) -> events.StepMetrics:
    return events.StepMetrics(
        step=step,
        total_steps=6,
        epoch=step / 6,
        loss=loss,
        lr=1e-3,
        grad_norm=grad_norm,
        tokens=100,
        trained_tokens=50,
        tokens_per_s=10.0,
        step_time=0.1,
        elapsed=0.1 * step,
    )


def _started(resumed: int = 0) -> events.RunStarted:
    return events.RunStarted(
        run_dir="r",
        model="m",
        device="cpu",
        dtype="float32",
        params_total=10,
        params_trainable=2,
        total_steps=6,
        tokens_per_epoch=100,
        resumed_from_step=resumed,
    )


def _report() -> events.DatasetReport:
    return events.DatasetReport(split="train", files=["t.jsonl"], rows_read=3, rows_kept=3)


def test_a_resume_keeps_each_step_once_and_everything_else_in_order(tmp_path):
    writer = RunWriter(tmp_path, RunConfig())
    first = [
        _report(),
        _started(),
        *[_step(s, 10.0 - s) for s in range(1, 6)],
        events.CheckpointSaved(step=4, path="c4"),
        events.EvalMetrics(step=5, loss=4.0, tokens=9),
        events.Notice(topic="memory", message="re-planned", step=5),
        events.Notice(topic="x", message="whole run"),
    ]
    for event in first:
        writer.write(event)
    writer.close()  # killed after step 5; the newest checkpoint is step 4
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('{"event": "StepMetrics", "step": 6, "lo')  # the line the kill cut

    writer = RunWriter(tmp_path, RunConfig())
    writer.write(_report())  # this attempt's own lines, before the checkpoint is loaded, stay
    writer.forget_steps_after(4)
    assert writer.last_loss == 6.0  # step 4's loss: the final loss if no step runs
    second = [_started(resumed=4), _step(5, 5.5), _step(6, 4.5)]
    for event in second:
        writer.write(event)
    writer.close()

    kept = [e for e in first if not (getattr(e, "step", None) or 0) > 4]
    got = read_events(tmp_path)
    assert [(type(e).__name__, getattr(e, "step", None)) for e in got] == [
        (type(e).__name__, getattr(e, "step", None)) for e in [*kept, _report(), *second]
    ]
    assert [e.loss for e in got if isinstance(e, events.StepMetrics)] == [9.0, 8.0, 7.0, 6.0, 5.5, 4.5]
    assert all(_strict(line) for line in metrics.read_text().splitlines())


def test_a_cut_last_line_is_dropped_and_a_cut_log_line_ended(tmp_path):
    writer = RunWriter(tmp_path, RunConfig())
    writer.write(_step(1, 2.0))
    writer.close()
    whole = (tmp_path / "metrics.jsonl").read_bytes()
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"event": "StepMe')
    with open(tmp_path / "train.log", "ab") as f:
        f.write(b"2025-01-01 00:00:00 step 2/6  lo")
    writer = RunWriter(tmp_path, RunConfig())
    writer.write(_step(2, 1.5))
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_bytes()
    assert lines.startswith(whole) and lines.count(b"\n") == 2 and b"StepMe\n" not in lines
    assert [e.step for e in read_events(tmp_path)] == [1, 2]
    log = (tmp_path / "train.log").read_text().splitlines()
    assert "2025-01-01 00:00:00 step 2/6  lo" in log  # the killed run's last words, on a line of their own
    assert "step 2/6  loss 1.5000" in log[-1]


def test_numbers_that_are_not_finite_are_written_as_null_and_read_back_as_nan(tmp_path):
    writer = RunWriter(tmp_path, RunConfig())
    writer.write(_started())
    writer.write(_step(6, math.nan, grad_norm=math.inf))  # the last step: run.json is rewritten
    writer.write(events.RunFinished(step=6, run_dir=str(tmp_path), adapter_dir="a", final_loss=math.nan, elapsed=1.0))
    writer.close()
    lines = [_strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["loss"] is None and lines[1]["grad_norm"] is None and lines[2]["final_loss"] is None
    summary = _strict((tmp_path / "run.json").read_text())
    assert summary["final_loss"] is None and summary["status"] == "finished"
    step, finished = read_events(tmp_path)[1:]
    assert math.isnan(step.loss) and math.isnan(step.grad_norm) and math.isnan(finished.final_loss)
    assert "finished after 6 steps in 1 s: no loss recorded" in (tmp_path / "train.log").read_text()


@pytest.mark.parametrize(
    ("last", "kept"),
    [
        (None, False),
        (events.RunFailed(reason="the data has no usable rows"), False),
        (events.RunFailed(reason="ValueError: boom", details="Traceback ...\n"), True),  # train.log has the traceback
        (_started(), True),
    ],
)
def test_a_folder_made_for_a_run_is_removed_when_the_run_never_started(tmp_path, last, kept):
    run_dir = tmp_path / "new-run"
    writer = RunWriter(run_dir, RunConfig(), created=True)
    writer.write(_report())
    if last is not None:
        writer.write(last)
    writer.close()
    assert run_dir.is_dir() == kept
    writer = RunWriter(tmp_path / "resumed", RunConfig())  # a folder the run did not make is never removed
    writer.write(events.RunFailed(reason="the data has no usable rows"))
    writer.close()
    assert read_summary(tmp_path / "resumed").status == "failed"


def test_failed_attempts_leave_no_run_folder(tiny_model_dir, chat_files, tiny_config, tmp_path):
    runs = tmp_path / "runs"
    missing = tiny_config(tmp_path / "no-such-model", chat_files, runs)
    got = list(Trainer(missing, device="cpu").run())
    assert isinstance(got[-1], events.RunFailed) and "no-such-model does not exist" in got[-1].reason
    assert not runs.exists() or not any(runs.iterdir())

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"messages": []}\n', encoding="utf-8")
    no_rows = tiny_config(tiny_model_dir("tiny-dense"), (empty, chat_files[1]), runs)
    got = list(Trainer(no_rows, device="cpu").run())
    assert isinstance(got[-1], events.RunFailed) and "none of the 1 training rows" in got[-1].reason, got[-1]
    assert not any(runs.iterdir()), sorted(runs.rglob("*"))


def test_a_run_json_write_on_a_full_disk_overwrites_in_place(tmp_path, monkeypatch):
    """run.json must not stay "running" when there is no room for its temporary copy."""
    import errno
    import os

    writer = RunWriter(tmp_path, RunConfig())
    writer.write(_started())
    real_fsync = os.fsync
    calls = []

    def fsync_on_a_full_disk(fd):  # the temporary copy is the first fsync; a full disk fails it
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_on_a_full_disk)
    writer.write(events.RunFailed(reason="disk full"))
    writer.close()
    assert _strict((tmp_path / "run.json").read_text())["status"] == "failed"
    assert not (tmp_path / ".run.json.tmp").exists()

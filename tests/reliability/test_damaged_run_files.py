"""Every reader of a run folder's files against damaged ones: run.json (the run history), metrics.jsonl (the Monitor,
the Runs page), config.toml and a checkpoint's state (a resume). A damaged file never raises out of a reader: the run
lists as "damaged" with the file, the field and what to do; a line no Hone wrote is skipped and counted; a resume
stops with one HoneError naming the file. Corpus: tests/reliability/damaged_runs.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train.run_dir import EventTail, RunWriter, list_runs, live_summary, read_events, read_summary
from tests.reliability import damaged_runs as corpus

EXPECTED_TYPES = {  # RunSummary's fields as the run history uses them
    "run_dir": str,
    "name": str,
    "model": str,
    "status": str,
    "step": int,
    "total_steps": int,
    "started": float,
    "updated": float,
    "reason": str,
}


def _check_types(summary) -> None:
    for name, kind in EXPECTED_TYPES.items():
        value = getattr(summary, name)
        assert type(value) is kind, f"{name} = {value!r}"
    assert summary.step >= 0 and summary.total_steps >= 0
    assert 0 <= summary.started < 253402300800 and math.isfinite(summary.updated)
    for loss in (summary.final_loss, summary.eval_loss):
        assert loss is None or (type(loss) is float and math.isfinite(loss))


# ---- run.json ----


@pytest.mark.parametrize("case", list(corpus.RUN_JSON))
def test_a_damaged_run_json_lists_as_damaged_naming_the_file_and_field(tmp_path, case):
    mtime = 1_800_000_000.0
    run_dir = corpus.write_damaged_run_json(tmp_path / "runs" / "r", case, mtime=mtime)
    expected = corpus.RUN_JSON[case][1]
    for summary in (read_summary(run_dir), live_summary(run_dir), *list_runs(tmp_path / "runs")):
        assert summary is not None and summary.status == "damaged"
        assert summary.reason.startswith("run.json") and expected in summary.reason, summary.reason
        assert len(summary.reason) < 400, "a reason is a line, not the file"
        assert f"hone train --resume {run_dir}" in summary.advice and "delete the folder" in summary.advice
        assert summary.run_dir == str(run_dir) and summary.name == "r"
        _check_types(summary)


def test_a_damaged_summary_keeps_every_field_it_could_read_and_dates_the_rest_by_the_folder(tmp_path):
    mtime = 1_800_000_000.0
    run_dir = corpus.write_damaged_run_json(tmp_path / "r", "started-yesterday", mtime=mtime)
    summary = read_summary(run_dir)
    assert summary.status == "damaged"
    assert summary.reason == "run.json: started is 'yesterday', not a time"
    assert (summary.model, summary.step, summary.total_steps, summary.final_loss) == (corpus.MODEL, 2, 2, 1.5)
    assert summary.started == mtime and summary.updated == corpus.T0 + 5
    run_dir = corpus.write_damaged_run_json(tmp_path / "s", "step-abc")
    summary = read_summary(run_dir)
    assert summary.reason == "run.json: step is 'abc', not a whole number"
    assert (summary.step, summary.started, summary.model) == (0, corpus.T0, corpus.MODEL)


def test_a_run_json_with_several_damaged_fields_names_each(tmp_path):
    run_dir = corpus.write_run(tmp_path / "r")
    (run_dir / "run.json").write_text(json.dumps(corpus.valid_summary(run_dir, model=5, step=-1, status=None)))
    assert read_summary(run_dir).reason == (
        "run.json: model is 5, not text; status is null, not text; step is -1, below 0"
    )


def test_a_valid_run_json_reads_as_written(tmp_path):
    run_dir = corpus.write_run(tmp_path / "r", losses=(2.0, 1.25))
    summary = read_summary(run_dir)
    assert (summary.status, summary.step, summary.total_steps, summary.final_loss) == ("finished", 2, 2, 1.25)
    assert (summary.reason, summary.advice, summary.started) == ("", "", corpus.T0)
    _check_types(summary)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs as on POSIX")
def test_a_run_json_that_is_a_fifo_is_damaged_at_once_never_waited_on(tmp_path):
    run_dir = corpus.write_run(tmp_path / "r")
    (run_dir / "run.json").unlink()
    os.mkfifo(run_dir / "run.json")
    t = time.monotonic()
    summary = read_summary(run_dir)  # opening a FIFO for reading blocks until a writer comes: never here
    assert time.monotonic() - t < 1.0
    assert summary.status == "damaged" and summary.reason == "run.json is not a regular file"


def test_a_folder_without_run_json_is_no_run(tmp_path):
    (tmp_path / "runs" / "notes").mkdir(parents=True)
    assert read_summary(tmp_path / "runs" / "notes") is None and list_runs(tmp_path / "runs") == []


def test_the_corpus_lists_valid_runs_by_start_and_damaged_ones_by_folder_time(tmp_path):
    folders = corpus.write_corpus(tmp_path / "runs")
    runs = list_runs(tmp_path / "runs")
    assert sorted(Path(s.run_dir).name for s in runs) == sorted(folders)
    damaged = [f"json-{case}" for case in reversed(corpus.RUN_JSON)]  # newest folder first
    assert [Path(s.run_dir).name for s in runs] == [*damaged, "valid-new", "bad-failure", "bad-metrics", "valid-old"]
    by_name = {Path(s.run_dir).name: s for s in runs}
    assert by_name["valid-new"].status == "finished" and by_name["valid-new"].final_loss == 1.0
    assert by_name["bad-metrics"].status == by_name["bad-failure"].status == "failed"
    for summary in runs:
        _check_types(summary)


def test_a_resume_writes_a_damaged_run_json_whole_again(tmp_path):
    """RunWriter, opening the folder of a resume, reads the damaged summary without raising (it used to end the
    resume with "UnicodeDecodeError … see train.log" and nothing in train.log) and writes a valid one."""
    run_dir = corpus.write_damaged_run_json(tmp_path / "r", "not-utf8", mtime=1_800_000_000.0)
    writer = RunWriter(run_dir, RunConfig())
    writer.write(events.RunFinished(step=3, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=1.0))
    writer.close()
    summary = read_summary(run_dir)
    assert (summary.status, summary.step, summary.reason) == ("finished", 3, "")
    assert summary.started == 1_800_000_000.0  # the folder's time stood in for the start it could not read


# ---- metrics.jsonl ----


def test_a_resume_drops_the_later_steps_past_damaged_lines_of_metrics(tmp_path):
    """RunWriter.forget_steps_after, which a resume calls, reads every line: damaged ones do not stop it."""
    run_dir = corpus.write_damaged_metrics(tmp_path / "r", list(corpus.METRICS))
    writer = RunWriter(run_dir, RunConfig())
    writer.forget_steps_after(1)
    writer.close()
    got = read_events(run_dir)
    assert [e.step for e in got if isinstance(e, events.StepMetrics)] == [1]
    assert writer.last_loss == 2.0
    assert [type(e).__name__ for e in got] == ["RunStarted", "StepMetrics", "RunFailed", "Notice"]


REASONS = {  # what from_line says about each damaged line
    "failed-reason-5": "RunFailed: reason is 5, not text",
    "failed-reason-list": 'RunFailed: reason is ["a"], not text',
    "loss-x": "StepMetrics: loss is 'x', not a number",
    "step-true": "StepMetrics: step is true, not a whole number",
    "step-float": "StepMetrics: step is 3.5, not a whole number",
    "time-string": "StepMetrics: time is 'now', not a number",
    "time-infinite": "StepMetrics: time is Infinity, not a time",
    "expert-load-strings": "StepMetrics: expert_load[0] is 'a', not a whole number",
    "skipped-counts-text": "DatasetReport: skipped['a'] is 'b', not a whole number",
    "config-a-string": "RunStarted: config is 'x', not an object",
    "unknown-kind": "an event of unknown kind 'Exploded'",
    "kind-a-list": 'an event of unknown kind ["RunFailed"]',
    "no-kind": 'a JSON object without an "event" key',
    "a-list": "a JSON array, not an object",
    "a-number": "a JSON number, not an object",
    "missing-fields": "StepMetrics: total_steps is missing",
    "not-utf8": "not UTF-8",
    "not-json": "not valid JSON",
    "huge": "longer than",
    "deeply-nested": "nested",
}


@pytest.mark.parametrize("case", list(corpus.METRICS))
def test_a_line_no_hone_wrote_is_refused_with_why(case):
    with pytest.raises(events.EventError) as caught:
        events.from_line(corpus.METRICS[case])
    assert REASONS[case] in str(caught.value)
    assert len(str(caught.value)) < 300


def test_every_damaged_line_is_skipped_counted_and_the_rest_read(tmp_path):
    run_dir = corpus.write_damaged_metrics(tmp_path / "r", list(corpus.METRICS))
    tail = EventTail(run_dir)
    got = tail.read()
    # the run's own lines: RunStarted, two steps, its RunFailed; then the Notice after the damaged lines
    assert [type(e).__name__ for e in got] == ["RunStarted", "StepMetrics", "StepMetrics", "RunFailed", "Notice"]
    assert [e.loss for e in got if isinstance(e, events.StepMetrics)] == [2.0, 1.5]
    assert got[3].reason == "the GPU ran out of memory" and got[-1].message == "the last line"
    assert tail.skipped == len(corpus.METRICS) == 20
    assert tail.skipped_note() == (
        "20 lines of metrics.jsonl could not be read (line 5: RunFailed: reason is 5, not text)"
    )
    assert read_events(run_dir) == got


def test_a_reader_following_a_run_counts_what_it_skipped_once(tmp_path):
    run_dir = corpus.write_run(tmp_path / "r")
    tail = EventTail(run_dir)
    assert len(tail.read()) == 4 and tail.skipped == 0 and tail.skipped_note() == ""
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(corpus.METRICS["loss-x"] + b"\n" + corpus.METRICS["failed-reason-5"][:20])
    assert tail.read() == [] and tail.skipped == 1
    with open(run_dir / "metrics.jsonl", "ab") as f:
        f.write(corpus.METRICS["failed-reason-5"][20:] + b"\n")
    assert tail.read() == [] and tail.skipped == 2
    assert (
        tail.skipped_note()
        == "2 lines of metrics.jsonl could not be read (line 5: StepMetrics: loss is 'x', not a number)"
    )


def test_a_line_too_long_is_skipped_while_it_is_still_being_written(tmp_path):
    """A line past the limit is dropped as it comes, never held whole, and the lines after it are read."""
    run_dir = corpus.write_run(tmp_path / "r")
    tail = EventTail(run_dir)
    tail.read()
    chunk = b"x" * (1 << 20)
    with open(run_dir / "metrics.jsonl", "ab") as f:
        for _ in range(events.MAX_LINE_BYTES // len(chunk) + 2):
            f.write(chunk)
            f.flush()
            assert tail.read() == []
            assert len(tail.partial) <= events.MAX_LINE_BYTES
        f.write(b"\n" + corpus.METRICS["loss-x"].replace(b'"x"', b"0.5") + b"\n")
    got = tail.read()
    assert [e.loss for e in got] == [0.5] and tail.skipped == 1


def test_from_dict_keeps_not_finite_floats_as_nan_and_optional_ones_as_none():
    step = dict(corpus._STEP, loss=None, lr=2, grad_norm=float("inf"))
    event = events.from_dict(step)
    assert math.isnan(event.loss) and event.lr == 2.0 and type(event.lr) is float and math.isnan(event.grad_norm)
    finished = events.from_dict(
        {"event": "RunFinished", "step": 1, "run_dir": "r", "adapter_dir": "a", "final_loss": None, "elapsed": 1}
    )
    assert finished.eval_loss is None and math.isnan(finished.final_loss)
    notice = events.from_dict({"event": "Notice", "topic": "t", "message": "m", "step": None, "future": [1]})
    assert notice.step is None and notice.level == "info"  # keys of newer versions are ignored


# ---- a resume's files: config.toml, a checkpoint's state ----


def _checkpoint(run_dir: Path, state: bytes) -> Path:
    """checkpoints/step-000002 whose manifest verifies `state` (as a hand-edited or crafted checkpoint would)."""
    folder = run_dir / "checkpoints" / "step-000002"
    folder.mkdir(parents=True)
    files = {}
    for name, data in (("trainable.safetensors", b"w"), ("training_state.pt", b"t"), ("state.json", state)):
        (folder / name).write_bytes(data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"hone_checkpoint": 2, "files": files}))
    return folder


GOOD_STATE = {"step": 2, "position": 4, "epoch": 0, "total_steps": 2, "layout": {}, "data": {"train": [], "eval": []}}
STATE_CASES = {  # state.json -> what the refusal says after "checkpoints/step-000002/state.json"
    "not-utf8": (b'{"step": 2, "x": "\xff"}', "is not UTF-8"),
    "a-list": (b"[2]", "holds a JSON array, not an object"),
    "cut-short": (b'{"step": 2, "posi', "is not valid JSON"),
    "step-abc": (json.dumps({**GOOD_STATE, "step": "abc"}).encode(), "step is 'abc', not a whole number"),
    "step-negative": (json.dumps({**GOOD_STATE, "step": -2}).encode(), "step is -2, below 0"),
    "no-position": (
        json.dumps({k: v for k, v in GOOD_STATE.items() if k != "position"}).encode(),
        "position is missing",
    ),
    "epoch-x": (json.dumps({**GOOD_STATE, "epoch": "x"}).encode(), "epoch is 'x', not a whole number"),
    "total-steps-x": (json.dumps({**GOOD_STATE, "total_steps": "x"}).encode(), "total_steps is 'x'"),
    "layout-a-list": (json.dumps({**GOOD_STATE, "layout": [1]}).encode(), "layout is [1], not an object"),
    "data-a-string": (json.dumps({**GOOD_STATE, "data": "x"}).encode(), "data is 'x', not an object"),
    "data-entry-bad": (
        json.dumps({**GOOD_STATE, "data": {"train": [{"name": "a", "size": "big"}]}}).encode(),
        "data.train[0]",
    ),
}


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_resuming_from_a_damaged_checkpoint_state_says_which_file_and_what(tmp_path, case):
    from hone.core.train.resume_checks import check_resume

    run_dir = corpus.write_run(tmp_path / "r")
    data, expected = STATE_CASES[case]
    folder = _checkpoint(run_dir, data)
    with pytest.raises(HoneError) as caught:
        check_resume(run_dir, RunConfig.load(run_dir / "config.toml"))
    assert caught.value.message.startswith(f"{folder / 'state.json'} ")
    assert expected in caught.value.message, caught.value.message
    assert "step-000002" in caught.value.advice and "start a new run" in caught.value.advice


def test_a_valid_checkpoint_state_still_resumes(tmp_path):
    from hone.core.train.resume_checks import check_resume, data_fingerprint

    run_dir = corpus.write_run(tmp_path / "r", status="failed")
    config = RunConfig.load(run_dir / "config.toml")
    _checkpoint(run_dir, json.dumps({**GOOD_STATE, "data": data_fingerprint(config.data)}).encode())
    check = check_resume(run_dir, config)
    assert (check.step, check.state["position"]) == (2, 4)


def test_a_damaged_training_state_is_a_hone_error_naming_it(tmp_path):
    import torch

    from hone.core.train.checkpoints import load_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    folder = tmp_path / "step-000002"
    folder.mkdir()
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2, 2)}, folder / "trainable.safetensors")
    (folder / "state.json").write_text(json.dumps(GOOD_STATE))
    for training, what in (
        ({"scheduler": {}}, "has no optimizer state"),
        ([1, 2], "holds a list, not the training state"),
        ({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": {"python": 5}}, "rng"),
    ):
        torch.save(training, folder / "training_state.pt")
        with pytest.raises(HoneError) as caught:
            load_checkpoint(folder, model, optimizer, scheduler)
        assert caught.value.message.startswith(f"{folder / 'training_state.pt'} ") and what in caught.value.message
    (folder / "trainable.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(HoneError) as caught:
        load_checkpoint(folder, model, optimizer, scheduler)
    assert caught.value.message.startswith(f"{folder / 'trainable.safetensors'} cannot be read")


def test_hone_train_resume_of_a_damaged_checkpoint_says_so_in_one_message(tmp_path):
    run_dir = corpus.write_run(tmp_path / "r", status="failed")
    folder = _checkpoint(run_dir, STATE_CASES["not-utf8"][0])
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "train", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    shown = "".join((out.stdout + out.stderr).split())
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "".join(f"{folder / 'state.json'} is not UTF-8".split()) in shown, shown[-2000:]
    assert "Traceback" not in shown and "train.log" not in shown


def test_a_run_whose_run_json_is_damaged_resumes_and_lists_whole_again(tiny_model_dir, tmp_path):
    """A real run, stopped after its step-2 checkpoint, its run.json then damaged: the resume goes on from the
    checkpoint (it used to fail at once with "UnicodeDecodeError … see train.log", and train.log said nothing)."""
    from hone.core.demo.text_data import make_dataset
    from hone.core.train.trainer import Trainer
    from tests.core.conftest import make_tiny_config, write_rows

    train, eval_rows = make_dataset(n_train=16, n_eval=4, seed=3)
    data = write_rows(tmp_path / "train.jsonl", train), write_rows(tmp_path / "eval.jsonl", eval_rows)
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"), data, tmp_path / "runs", "output.name=r", "train.max_steps=2"
    )
    assert isinstance(list(Trainer(config, device="cpu").run())[-1], events.RunFinished)
    run_dir = tmp_path / "runs" / "r"
    (run_dir / "run.json").write_bytes(corpus.run_json_bytes(run_dir, "not-utf8"))
    assert list_runs(tmp_path / "runs")[0].status == "damaged"
    longer = RunConfig.load(run_dir / "config.toml").with_overrides(["train.max_steps=3"])
    got = list(Trainer(longer, resume_dir=run_dir, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    assert [e.step for e in got if isinstance(e, events.StepMetrics)] == [3]
    (summary,) = list_runs(tmp_path / "runs")
    assert (summary.status, summary.step, summary.total_steps, summary.reason) == ("finished", 3, 3, "")
    _check_types(summary)

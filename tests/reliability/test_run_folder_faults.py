"""A run folder against what users and machines do to it: a second process on it, a disk that fills up, a crafted
training_state.pt. Each through real processes (`hone train`, a second Python holding the lock) and real files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.checkpoints import latest_checkpoint
from hone.core.train.run_dir import read_events
from hone.core.train.run_lock import read_holder
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config, write_rows

# A second process taking the run folder's lock: prints "locked" (or the refusal) and waits for its stdin to close.
HOLD = (
    "import sys\nfrom hone.core.train.run_lock import RunLock\nfrom hone.core.errors import HoneError\n"
    "try:\n    RunLock.acquire(sys.argv[1])\nexcept HoneError as e:\n    print(e.message, flush=True)\n"
    "    raise SystemExit(1)\nprint('locked', flush=True)\nsys.stdin.read()\n"
)


def _hone(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *args], capture_output=True, text=True, timeout=600, **kwargs
    )


def _shows(out: subprocess.CompletedProcess, text: str) -> bool:
    """Whether the command printed `text` (the console wraps long lines anywhere, paths included)."""
    return "".join(text.split()) in "".join((out.stdout + out.stderr).split())


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _strict(line: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from hone.core.demo.text_data import make_dataset

    folder = tmp_path_factory.mktemp("data")
    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    return write_rows(folder / "train.jsonl", train), write_rows(folder / "eval.jsonl", eval_rows)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir, data):
    runs = tmp_path_factory.mktemp("runs")
    config = make_tiny_config(tiny_model_dir("tiny-dense"), data, runs, "output.name=done", "train.max_steps=2")
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return runs / "done"


@pytest.mark.skipif(os.name != "posix", reason="the holder is killed with SIGKILL")
def test_a_second_process_on_a_run_folder_stops_at_once_saying_who_holds_it(finished_run, tmp_path):
    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        before = _snapshot(run_dir)
        out = _hone("train", "--resume", str(run_dir))
        assert out.returncode == 2, out.stderr[-2000:]  # refused before the resume reads a checkpoint
        assert _shows(
            out, f"the run folder {run_dir} is in use: pid {holder.pid} on host {socket.gethostname()!r} since "
        ), out.stdout[-2000:]
        assert _shows(out, "wait for that run to end or stop it") and "Traceback" not in out.stdout + out.stderr
        assert _snapshot(run_dir) == before  # not a byte written: no event, no log line, no run.json
    finally:
        holder.kill()  # SIGKILL: the OS drops its lock; its run.lock file stays behind
        holder.wait()
    assert read_holder(run_dir)["pid"] == holder.pid
    again = subprocess.run(
        [sys.executable, "-c", HOLD, str(run_dir)], input="", capture_output=True, text=True, timeout=120
    )
    assert again.stdout == "locked\n", again.stdout + again.stderr  # a stale lock file blocks nobody


def test_a_training_run_holds_its_folder_until_it_ends(tiny_model_dir, data, tmp_path):
    config = make_tiny_config(tiny_model_dir("tiny-dense"), data, tmp_path, "output.name=held", "train.max_steps=2")
    run = Trainer(config, device="cpu").run()
    for event in run:
        if isinstance(event, events.StepMetrics):
            break  # the run is paused mid-way, in this process
    other = subprocess.run(
        [sys.executable, "-c", HOLD, str(tmp_path / "held")], input="", capture_output=True, text=True, timeout=120
    )
    assert other.returncode == 1 and f"is in use: pid {os.getpid()} on host" in other.stdout, other.stdout
    rest = list(run)
    assert isinstance(rest[-1], events.RunFinished), rest[-1]
    other = subprocess.run(
        [sys.executable, "-c", HOLD, str(tmp_path / "held")], input="", capture_output=True, text=True, timeout=120
    )
    assert other.stdout == "locked\n", other.stdout + other.stderr


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="RLIMIT_FSIZE as on Linux")
def test_a_full_disk_fails_the_run_once_clearly_and_the_run_goes_on_once_there_is_room(tiny_model_dir, data, tmp_path):
    import resource

    limit = 100_000  # bytes per file: the step-2 checkpoint's weights (135 kB) do not fit, the logs do

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    config = make_tiny_config(
        tiny_model_dir("tiny-dense"),
        data,
        tmp_path / "runs",
        "output.name=full",
        "train.max_steps=4",
        "output.checkpoint_every=2",
    )
    config.save(tmp_path / "full.toml")
    run_dir = tmp_path / "runs" / "full"
    out = _hone("train", str(tmp_path / "full.toml"), preexec_fn=small_disk)
    assert out.returncode == 1, out.stderr[-3000:]
    shown = out.stdout + out.stderr
    reason = f"the disk is full: the checkpoint of step 2 could not be written in {run_dir}: File too large"
    assert "Traceback" not in shown and shown.count("the disk is full") == 1, shown[-3000:]
    assert _shows(out, reason), shown[-3000:]
    summary = _strict((run_dir / "run.json").read_text())
    assert summary["status"] == "failed" and summary["reason"] == reason
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    logged = [_strict(line) for line in text.splitlines()]
    assert logged[-1]["event"] == "RunFailed" and logged[-1]["reason"] == reason
    assert [e["step"] for e in logged if e["event"] == "StepMetrics"] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == []  # the half-written one is gone

    resumed = list(Trainer(RunConfig.load(run_dir / "config.toml"), resume_dir=run_dir, device="cpu").run())
    assert isinstance(resumed[-1], events.RunFinished) and resumed[-1].step == 4, resumed[-1]
    steps = [e.step for e in read_events(run_dir) if isinstance(e, events.StepMetrics)]
    assert steps == [1, 2, 3, 4]  # started over (no checkpoint was complete), each step once


# Writes steps through a RunWriter until the file-size limit stops one, then the failure, as the trainer does.
WRITE_UNTIL_FULL = """
import resource, sys
from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train.run_dir import RunWriter
writer = RunWriter(sys.argv[1], RunConfig())
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
step = 0
try:
    while True:
        step += 1
        writer.write(events.StepMetrics(step=step, total_steps=100, epoch=0.0, loss=1.0 / step, lr=1e-3,
                                        grad_norm=1.0, tokens=1, trained_tokens=1, tokens_per_s=1.0, step_time=1.0,
                                        elapsed=1.0))
except HoneError as e:
    writer.write(events.RunFailed(reason=e.message, advice=e.advice, step=step - 1))
    print(step - 1, e.message)
writer.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="RLIMIT_FSIZE as on Linux")
def test_metrics_that_hit_a_full_disk_stay_whole_lines_and_run_json_says_failed(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", WRITE_UNTIL_FULL, str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written, message = done.stdout.split(" ", 1)
    assert message.startswith(f"the disk is full: the StepMetrics event could not be written in {run_dir}: ")
    text = (run_dir / "metrics.jsonl").read_text()
    assert len(text.encode()) <= 4000 and text.endswith("\n")  # the step that did not fit was cut back whole
    lines = [_strict(line) for line in text.splitlines()]
    steps = [line["step"] for line in lines if line["event"] == "StepMetrics"]
    assert steps == list(range(1, int(written) + 1))
    assert [line["event"] for line in lines[len(steps) :]] in ([], ["RunFailed"]), "the failure fits, or is left out"
    summary = _strict((run_dir / "run.json").read_text())
    assert summary["status"] == "failed" and summary["reason"] == message.strip()


class Payload:
    """Pickled, it calls exec when unpickled: what a crafted training_state.pt in a shared run folder would hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_a_pickle_payload_in_a_checkpoint_is_refused_on_resume_and_never_runs(finished_run, tmp_path):
    import hashlib

    import torch

    run_dir = tmp_path / "done"
    shutil.copytree(finished_run, run_dir)
    checkpoint = latest_checkpoint(run_dir)
    marker = tmp_path / "payload-ran"
    state = checkpoint / "training_state.pt"
    saved = torch.load(state, weights_only=True)
    torch.save(dict(saved, optimizer=Payload(marker)), state)
    payload = state.read_bytes()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["training_state.pt"] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))  # the manifest verifies: the loader must refuse

    probe = tmp_path / "probe.pt"
    shutil.copy(state, probe)
    done = subprocess.run(
        [sys.executable, "-c", f"import torch; torch.load({str(probe)!r}, weights_only=False)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert marker.read_text() == "ran", done.stderr[-2000:]  # the payload is live: a loader that unpickles runs it
    marker.unlink()

    out = _hone("train", "--resume", str(run_dir), "--set", "train.max_steps=4")  # longer: it has finished
    assert out.returncode == 1, out.stderr[-2000:]
    assert _shows(
        out,
        f"{state} holds Python objects besides tensors and plain values, and loading it could run "
        "code, so Hone does not (Unsupported global: GLOBAL exec was not an allowed global by default)",
    ), out.stdout[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and not marker.exists()


@pytest.mark.skipif(os.name != "posix", reason="the holder is killed with SIGKILL")
def test_a_run_whose_process_was_killed_reads_as_interrupted_and_one_training_elsewhere_as_running(tmp_path):
    from hone.core.config import RunConfig
    from hone.core.train.run_dir import INTERRUPTED, RunWriter, list_runs, live_summary
    from hone.core.train.run_lock import LOCK_FILE, in_use

    run_dir = tmp_path / "runs" / "cut"
    writer = RunWriter(run_dir, RunConfig())
    writer.write(
        events.RunStarted(
            run_dir=str(run_dir),
            model="m",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=40,
            tokens_per_epoch=100,
        )
    )
    writer.close()  # as far as run.json goes, a run that never ended
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        assert in_use(run_dir) is True
        assert live_summary(run_dir).status == "running"
    finally:
        holder.kill()
    if sys.platform.startswith("linux"):  # killed but not reaped yet: a zombie, which signal 0 still finds
        os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)  # it has ended; its entry is kept
        assert in_use(run_dir) is False
    holder.wait()
    assert in_use(run_dir) is False
    [summary] = list_runs(tmp_path / "runs")
    assert summary.status == INTERRUPTED and summary.reason == "the process training it ended before the run did"
    assert live_summary(run_dir).status == INTERRUPTED
    note = json.loads((run_dir / LOCK_FILE).read_text())
    (run_dir / LOCK_FILE).write_text(json.dumps({**note, "host": "another-computer"}) + "\n")
    assert in_use(run_dir) is None  # a process on another computer cannot be checked from here
    assert live_summary(run_dir).status == "running"
    (run_dir / LOCK_FILE).unlink()
    assert in_use(run_dir) is False


def test_only_process_0_of_a_torchrun_refuses_a_folder_in_use(tmp_path, monkeypatch):
    """Process 0 of a resumed run may lock the folder before process 1 checks it: process 1 leaves the check to it."""
    from hone.core.errors import HoneError
    from hone.core.train.run_lock import refuse_if_in_use

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        refuse_if_in_use(run_dir)  # process 1: process 0 checks
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(HoneError, match="is in use"):
            refuse_if_in_use(run_dir)
    finally:
        holder.kill()
        holder.wait()


def test_a_released_lock_leaves_no_holder_even_where_the_note_cannot_be_shortened(tmp_path, monkeypatch):
    from hone.core.train import run_lock

    for refuse_truncate in (False, True):
        run_dir = tmp_path / f"run-{refuse_truncate}"
        run_dir.mkdir()
        lock = run_lock.RunLock.acquire(run_dir)
        assert run_lock.read_holder(run_dir)["pid"] == os.getpid()
        if refuse_truncate:  # as Windows may for a file with a locked range

            def refuse(fd, length):
                raise PermissionError(13, "the file has a locked range")

            monkeypatch.setattr(run_lock.os, "ftruncate", refuse)
        lock.release()
        assert run_lock.read_holder(run_dir) == {} and run_lock.in_use(run_dir) is False

"""`hone train` asked to end by the system, as real processes are: SIGTERM (kill, docker stop, a scheduler) and
SIGHUP (a closed terminal or SSH session) stop at the next step boundary with a checkpoint and the adapter, mark the
run "stopped" and exit 75 (EX_TEMPFAIL); the run then goes on with `--resume`. A second signal, or a step that does
not end within the grace period (HONE_STOP_GRACE_S), ends the process at once with the last complete checkpoint
intact. Slow steps come from tests/helpers/train_process.py (HONE_TEST_HANG_STEP: a step that takes 10 minutes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hone.core import events
from hone.core.train.checkpoints import checkpoint_report, complete_checkpoints
from hone.core.train.run_dir import live_summary, read_events
from tests.core.conftest import make_tiny_config, write_rows

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGTERM and SIGHUP are POSIX signals")

HELPER = Path(__file__).resolve().parents[1] / "helpers" / "train_process.py"
EXIT_STOPPED_BY_SYSTEM = 75  # EX_TEMPFAIL, documented in `hone train --help`
SETTINGS = ["train.max_steps=5000", "data.max_length=128", "train.batch_tokens=128", "data.eval=[]"]


def _start(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HELPER), "train", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **env),
    )


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"no {what}: exit {proc.wait()}, {proc.stderr.read().decode()[-3000:]}")


def _steps(run_dir: Path) -> list[int]:
    return [e.step for e in read_events(run_dir) if isinstance(e, events.StepMetrics)]


def _end(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[int, float, str]:
    """The exit code, the seconds it took to end, and what it printed to stderr."""
    started = time.monotonic()
    code = proc.wait(timeout)
    return code, time.monotonic() - started, proc.stderr.read().decode()


@pytest.fixture
def config_file(tiny_model_dir, tmp_path):
    from hone.core.demo.text_data import make_dataset

    rows, _ = make_dataset(n_train=24, n_eval=4, seed=3)
    train = write_rows(tmp_path / "train.jsonl", rows)

    def make(*settings: str) -> Path:
        model = tiny_model_dir("tiny-dense")
        config = make_tiny_config(model, (train, train), tmp_path / "runs", *SETTINGS, *settings)
        config.save(tmp_path / "run.toml")
        return tmp_path / "run.toml"

    return make


@pytest.mark.slow  # two `hone train` processes, ~15 s
def test_sigterm_and_sighup_save_the_run_and_it_goes_on(config_file, tmp_path):
    run_dir = tmp_path / "runs" / "signals"
    proc = _start(str(config_file("output.name=signals")))
    _wait_for(proc, lambda: _steps(run_dir), "first step")
    proc.send_signal(signal.SIGTERM)
    code, _, said = _end(proc)
    assert code == EXIT_STOPPED_BY_SYSTEM, said[-3000:]
    first = json.loads((run_dir / "run.json").read_text())
    assert first["status"] == "stopped" and first["step"] >= 1, first
    stopped_at = first["step"]
    assert complete_checkpoints(run_dir)[-1].name == f"step-{stopped_at:06d}"
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    ended = read_events(run_dir)[-1]
    assert isinstance(ended, events.RunFinished) and ended.stopped and ended.step == stopped_at, ended
    assert "hone train --resume" in said  # what to do next, said where the log of a scheduler's job ends

    proc = _start("--resume", str(run_dir))
    _wait_for(proc, lambda: _steps(run_dir)[-1] > stopped_at, "step after the resume")
    proc.send_signal(signal.SIGHUP)
    code, _, said = _end(proc)
    assert code == EXIT_STOPPED_BY_SYSTEM, said[-3000:]
    second = json.loads((run_dir / "run.json").read_text())
    assert second["status"] == "stopped" and second["step"] > stopped_at, second
    assert complete_checkpoints(run_dir)[-1].name == f"step-{second['step']:06d}"
    assert _steps(run_dir) == list(range(1, second["step"] + 1))  # every step once, across the two processes


@pytest.mark.slow  # two `hone train` processes, ~15 s
def test_a_second_signal_or_the_grace_period_ends_a_step_in_flight_at_once(config_file, tmp_path):
    """Step 3 takes 10 minutes; step 2's checkpoint is complete. A second signal ends the process at once (no
    waiting for the step), and so does the grace period after one signal; step 2's checkpoint stays intact."""
    path = config_file("output.checkpoint_every=1", "output.keep_checkpoints=5")
    for name, grace, signals in (("twice", "60", (signal.SIGTERM, signal.SIGHUP)), ("grace", "1", (signal.SIGTERM,))):
        run_dir = tmp_path / "runs" / name
        proc = _start(str(path), "--set", f"output.name={name}", HONE_TEST_HANG_STEP="3", HONE_STOP_GRACE_S=grace)
        _wait_for(proc, lambda run_dir=run_dir: len(complete_checkpoints(run_dir)) == 2, "checkpoint of step 2")
        time.sleep(0.3)  # into step 3
        proc.send_signal(signals[0])
        time.sleep(0.5)
        assert proc.poll() is None, f"{name}: the first signal ended the process before the step or the grace ended"
        for sig in signals[1:]:
            proc.send_signal(sig)
        code, took, said = _end(proc)
        assert code == EXIT_STOPPED_BY_SYSTEM, f"{name}: {said[-3000:]}"
        assert took < (3.0 if name == "twice" else float(grace) + 3.0), f"{name}: took {took:.1f} s to end"
        complete, broken = checkpoint_report(run_dir)
        assert [p.name for p in complete] == ["step-000001", "step-000002"] and not broken, (name, complete, broken)
        assert _steps(run_dir) == [1, 2]
        assert live_summary(run_dir).status == "interrupted"  # no process trains it: the Runs page offers Resume
        assert f"hone train --resume {run_dir}" in " ".join(said.split()), said[-2000:]

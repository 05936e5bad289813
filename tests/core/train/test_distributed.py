"""Several processes training one run (torchrun, gloo on the CPU): two processes train exactly what one process
trains with the same packs per step, only process 0 writes, a kill and resume is exact, a resume on another number
of processes works and says it is not bit-exact, and a process that fails ends the others with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hone.core import events
from hone.core.cli import launch
from hone.core.cli import main as hone_main
from hone.core.config import RunConfig
from hone.core.train.checkpoints import complete_checkpoints
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or os.name != "posix", reason="torch.distributed with gloo, POSIX signals"
)

SETTINGS = [
    "train.max_steps=6",
    "data.max_length=128",
    "train.batch_tokens=256",
    "train.grad_accum=1",
    "output.checkpoint_every=2",
    "output.keep_checkpoints=5",
    "train.eval_every=3",
]
HELPER = Path(__file__).resolve().parents[2] / "helpers" / "train_process.py"


def torchrun(*args: str, processes: int = 2, script: Path | None = None, **popen) -> list[str]:
    program = [str(script)] if script else ["-m", "hone.core.cli"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(processes),
        *program,
        "train",
        *args,
    ]


def env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", HONE_STOP_FILE="")


def kill_with_children(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and the processes it started (each in a session of its own)."""
    import psutil  # accelerate's dependency

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.send_signal(signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def step_losses(run_dir: Path, after: int = 0) -> dict[int, float]:
    return {e.step: e.loss for e in read_events(run_dir) if isinstance(e, events.StepMetrics) and e.step > after}


def adapter_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


@pytest.fixture(scope="module")
def two_process_run(tiny_model_dir, chat_files, tmp_path_factory):
    """A 6-step run trained by two processes (dropout on, so each process's random state matters)."""
    from tests.core.conftest import make_tiny_config

    root = tmp_path_factory.mktemp("two")
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, root / "runs", *SETTINGS, "lora.dropout=0.1", "output.name=both"
    )
    config.save(root / "run.toml")
    done = subprocess.run(torchrun(str(root / "run.toml")), capture_output=True, text=True, timeout=600, env=env())
    assert done.returncode == 0, done.stderr[-4000:]
    return root, config, root / "runs" / "both", done


def test_two_processes_train_what_one_process_trains_and_only_process_0_writes(
    two_process_run, tiny_config, tiny_model_dir, chat_files, tmp_path
):
    root, _, run_dir, done = two_process_run
    assert [p.name for p in (root / "runs").iterdir()] == ["both"]  # one run folder, written once
    logged = read_events(run_dir)
    started = next(e for e in logged if isinstance(e, events.RunStarted))
    assert started.processes == 2
    assert [e.step for e in logged if isinstance(e, events.StepMetrics)] == [1, 2, 3, 4, 5, 6]
    assert all(len(e.mem_by_gpu) == 2 for e in logged if isinstance(e, events.StepMetrics))
    shared = next(e for e in logged if isinstance(e, events.Notice) and e.topic == "processes")
    assert "2 processes train together" in shared.message
    recorded = (run_dir / "config.toml").read_text()  # what runs: half the tokens per micro-batch, twice as many
    assert "batch_tokens = 128" in recorded and "grad_accum = 2" in recorded
    assert "[process 1]" not in done.stderr  # process 1 prints only a failure

    # One process with the same packs per step: micro-batches of 128 tokens, two per step. Without dropout the
    # two runs must agree to float32 rounding (the gradient sums run in another order).
    one = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        *SETTINGS,
        "lora.dropout=0",
        "output.name=one",
        "train.batch_tokens=128",
        "train.grad_accum=2",
        'train.sample_prompts=["Name a color.", "Count to three."]',
        "train.sample_max_new_tokens=6",
    )
    two = one.with_overrides(["output.name=two", "train.batch_tokens=256", "train.grad_accum=1"])
    two.save(tmp_path / "two.toml")
    ran = subprocess.run(torchrun(str(tmp_path / "two.toml")), capture_output=True, text=True, timeout=600, env=env())
    assert ran.returncode == 0, ran.stderr[-4000:]
    single = list(Trainer(one, device="cpu").run())
    assert isinstance(single[-1], events.RunFinished), single[-1]
    one_losses = {e.step: e.loss for e in single if isinstance(e, events.StepMetrics)}
    two_dir = tmp_path / "runs" / "two"
    assert step_losses(two_dir) == pytest.approx(one_losses, rel=1e-5)
    evals = [[e.loss for e in evts if isinstance(e, events.EvalMetrics)] for evts in (single, read_events(two_dir))]
    assert evals[1] == pytest.approx(evals[0], rel=1e-5) and len(evals[0]) == 2  # step 3 and the end
    assert_same_weights(adapter_weights(two_dir), adapter_weights(tmp_path / "runs" / "one"))
    # sample answers at each evaluation: both processes answer (they run every forward together), process 0 writes
    # one line per evaluation, the same answers as the one process's
    from hone.core.train.samples_file import read_samples

    both, alone = (read_samples(d) for d in (two_dir, tmp_path / "runs" / "one"))
    assert [s.step for s in both] == [s.step for s in alone] == [3, 6]
    assert [s.samples for s in both] == [s.samples for s in alone]
    assert [prompt for prompt, _ in both[0].samples] == ["Name a color.", "Count to three."]


def test_kill_and_resume_on_two_processes_is_exact(two_process_run, tmp_path):
    _, config, full_dir, _ = two_process_run
    killed = config.with_overrides(["output.name=killed", f"output.runs_dir={json.dumps(str(tmp_path))}"])
    killed.save(tmp_path / "killed.toml")
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        torchrun(str(tmp_path / "killed.toml"), script=HELPER),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(env(), HONE_TEST_HANG_STEP="4"),
    )
    deadline = time.time() + 300  # the processes wait before step 4, after the checkpoint of step 2
    while time.time() < deadline and proc.poll() is None and not complete_checkpoints(run_dir):
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    kill_with_children(proc)  # torchrun and both processes, with no chance to save anything more
    kept = complete_checkpoints(run_dir)[-1]
    resumed_from = int(kept.name.split("-")[1])
    assert resumed_from == 2

    training = torch.load(kept / "training_state.pt", weights_only=True)
    assert len(training["rng_by_rank"]) == 2  # each process's random state (dropout draws differ per process)
    done = subprocess.run(torchrun("--resume", str(run_dir)), capture_output=True, text=True, timeout=600, env=env())
    assert done.returncode == 0, done.stderr[-4000:]
    assert step_losses(run_dir, after=resumed_from) == step_losses(full_dir, after=resumed_from)
    assert_same_weights(adapter_weights(run_dir), adapter_weights(full_dir), atol=0)


def test_a_resume_on_one_process_goes_on_and_says_it_is_not_bit_exact(two_process_run, tmp_path):
    import shutil

    _, _, full_dir, _ = two_process_run
    run_dir = tmp_path / "from-two"
    shutil.copytree(full_dir, run_dir, ignore=shutil.ignore_patterns("run.lock"))
    checkpoints = complete_checkpoints(run_dir)
    for later in checkpoints[1:]:  # go back to step 2
        shutil.rmtree(later)
    recorded = RunConfig.load(run_dir / "config.toml")  # as `hone train --resume` reads it
    resumed = list(Trainer(recorded, resume_dir=run_dir, device="cpu").run())
    assert isinstance(resumed[-1], events.RunFinished), resumed[-1]
    said = [e.message for e in resumed if isinstance(e, events.Notice) and e.topic == "resume"]
    assert any("trained on 2 processes and goes on with 1" in m and "not bit for bit" in m for m in said), said
    losses = {e.step: e.loss for e in resumed if isinstance(e, events.StepMetrics)}
    # Without dropout's per-process draws the steps would match to rounding; with it they stay close.
    assert losses == pytest.approx(step_losses(full_dir, after=2), rel=0.05)


def test_a_failing_process_ends_the_others_with_a_clear_message(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", *SETTINGS, "output.name=fails")
    config.save(tmp_path / "fails.toml")
    started = time.monotonic()
    done = subprocess.run(
        torchrun(str(tmp_path / "fails.toml"), script=HELPER),
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(env(), HONE_TEST_FAIL_RANK="1", HONE_TEST_FAIL_STEP="3"),
    )
    assert done.returncode != 0
    assert time.monotonic() - started < 240  # torchrun ended process 0 instead of leaving it waiting
    assert "[process 1] run failed: RuntimeError: process 1 failed in step 3 on purpose" in done.stderr
    logged = read_events(tmp_path / "runs" / "fails")
    assert [e.step for e in logged if isinstance(e, events.StepMetrics)] == [1, 2]
    failed = logged[-1]
    assert isinstance(failed, events.RunFailed) and "another process of this run" in failed.reason, failed
    assert "hone train --resume" in failed.advice


def test_gpus_asks_for_gpus_this_machine_has(tmp_path, capsys, tiny_config, tiny_model_dir, chat_files, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs")
    config.save(tmp_path / "run.toml")
    assert hone_main(["train", str(tmp_path / "run.toml"), "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "--gpus 2 asks for 2 NVIDIA GPUs, and this machine has 0" in err and "drop --gpus" in err
    assert not (tmp_path / "runs").exists()


def test_torchrun_command_passes_the_run_on():
    args = Namespace(
        gpus=4,
        nnodes=1,
        node_rank=0,
        master_addr=None,
        master_port=29500,
        config="run.toml",
        overrides=["train.lr=1e-4"],
        resume=None,
        data_changed=None,
    )
    command = launch.torchrun_command(args, python="python")
    assert command == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "4",
        "--standalone",
        "-m",
        "hone.core.cli",
        "train",
        "run.toml",
        "--set",
        "train.lr=1e-4",
    ]
    two_machines = Namespace(
        **dict(
            vars(args),
            nnodes=2,
            node_rank=1,
            master_addr="10.0.0.1",
            config=None,
            overrides=[],
            resume="runs/a",
            data_changed="continue",
        )
    )
    assert launch.torchrun_command(two_machines, python="python")[3:] == [
        "--nproc-per-node",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29500",
        "-m",
        "hone.core.cli",
        "train",
        "--resume",
        "runs/a",
        "--data-changed",
        "continue",
    ]


def test_the_world_comes_from_torchrun_s_environment():
    from hone.core.errors import HoneError
    from hone.core.train import distributed

    assert distributed.from_environment({}) == distributed.SINGLE and not distributed.SINGLE.launched
    world = distributed.from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert world == distributed.World(3, 4, 1, launched=True, local_size=2) and not world.main
    assert world.share([[0], [1], [2], [3], [4], [5], [6], [7]]) == [[3], [7]]
    with pytest.raises(HoneError, match="RANK=4 is outside WORLD_SIZE=4"):
        distributed.from_environment({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(HoneError, match="are not numbers"):
        distributed.from_environment({"RANK": "a", "WORLD_SIZE": "4"})

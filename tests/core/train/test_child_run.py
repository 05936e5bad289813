"""`train_in_child`, the studio's way to train in a process of its own: a child `hone train` (`--gpus N` on several
GPUs), its events read back from the run folder. A detached run goes on without its reader. For several GPUs on
the CPU the child is torchrun with two gloo processes (the command `--gpus` builds needs GPUs); the refusal of
`--gpus 2` on a machine without them is the real one."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from hone.core import events
from hone.core.control import RunControl
from hone.core.train import child_run
from hone.core.train.run_dir import read_events

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or os.name != "posix", reason="torch.distributed with gloo, POSIX signals"
)


REAL_COMMAND = child_run.command_for


def two_cpu_processes(config_path, resume, gpus, data_changed):
    """What `command_for` runs, with torchrun's two gloo processes in place of the launcher's GPUs."""
    assert REAL_COMMAND(config_path, resume, gpus, data_changed)[-2:] == ["--gpus", "2"]
    args = [str(config_path)] if config_path else ["--resume", str(resume)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "hone.core.cli",
        "train",
        *args,
    ]


def test_events_arrive_as_written_and_stop_ends_after_a_step(
    tiny_model_dir, chat_files, tiny_config, tmp_path, monkeypatch
):
    monkeypatch.setattr(child_run, "command_for", two_cpu_processes)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        "train.max_steps=500",
        "data.max_length=128",
        "train.batch_tokens=256",
        "output.checkpoint_every=0",
    )
    control = RunControl()
    seen = []
    for event in child_run.train_in_child(config, control, gpus=[0, 1]):
        seen.append(event)
        if isinstance(event, events.StepMetrics) and event.step == 2:
            control.stop()
    finished = seen[-1]
    assert isinstance(finished, events.RunFinished) and finished.stopped, finished
    assert 2 <= finished.step < 500
    started = next(e for e in seen if isinstance(e, events.RunStarted))
    assert started.processes == 2
    run_dir = tmp_path / "runs" / os.listdir(tmp_path / "runs")[0]
    assert started.run_dir == str(run_dir)
    assert [type(e) for e in seen] == [type(e) for e in read_events(run_dir)]  # every event, once, in order
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs: the child would train")
def test_a_child_that_refuses_to_start_is_a_failed_run(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs")
    seen = list(child_run.train_in_child(config, RunControl(), gpus=[0, 1]))
    assert len(seen) == 1 and isinstance(seen[0], events.RunFailed)
    assert "asks for 2 NVIDIA GPUs, and this machine has" in seen[0].reason
    assert "drop --gpus" in seen[0].advice  # the child's own advice, not a generic one


def test_a_detached_run_goes_on_in_its_own_process(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        "train.max_steps=40",
        "data.max_length=128",
        "train.batch_tokens=256",
        "output.checkpoint_every=0",
    )
    control = RunControl()
    seen = []
    for event in child_run.train_in_child(config, control):
        seen.append(event)
        if isinstance(event, events.StepMetrics):
            control.detach()  # the window closes: reading ends, the run does not
    assert isinstance(seen[-1], events.StepMetrics) and seen[-1].step < 40
    run_dir = tmp_path / "runs" / next(p for p in os.listdir(tmp_path / "runs") if not p.startswith("."))
    deadline = time.time() + 300
    while time.time() < deadline and not any(isinstance(e, events.RunFinished) for e in read_events(run_dir)):
        time.sleep(0.2)
    finished = read_events(run_dir)[-1]
    assert isinstance(finished, events.RunFinished) and finished.step == 40 and not finished.stopped, finished
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert os.listdir(tmp_path / "runs") == [run_dir.name]  # the config it was started with is gone


def test_a_one_process_child_stops_through_its_stop_file_without_a_signal(
    tiny_model_dir, chat_files, tiny_config, tmp_path, monkeypatch
):
    """How the Studio stops its run on Windows, where there is no SIGINT to send: the same path on every system."""

    def no_signals(self, sig):
        raise AssertionError(f"a signal ({sig}) was sent to a one-process child")

    monkeypatch.setattr(child_run.subprocess.Popen, "send_signal", no_signals)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", "train.max_steps=500", "data.max_length=128",
        "train.batch_tokens=256", "output.checkpoint_every=0",
    )  # fmt: skip
    control = RunControl()
    seen = []
    for event in child_run.train_in_child(config, control):
        seen.append(event)
        if isinstance(event, events.StepMetrics) and event.step == 2:
            control.stop()
    finished = seen[-1]
    assert isinstance(finished, events.RunFinished) and finished.stopped and 2 <= finished.step < 500, finished
    assert (tmp_path / "runs" / os.listdir(tmp_path / "runs")[0] / "adapter" / "adapter_model.safetensors").is_file()

"""A run on several GPUs for a caller that reads events (the studio): `hone train --gpus N` in a child process,
its events read back from the run folder as process 0 writes them.

Stdlib only: the caller never imports torch for it. Stop asks the child to stop after the current step (SIGINT;
the launcher passes it on to the training processes through their stop file). Pausing is not offered: the
processes exchange gradients every step, and a pause would hold them in that exchange.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.errors import HoneError
from hone.core.train.run_dir import CONFIG_FILE, EventTail, new_run_dir

POLL_S = 0.5
STDERR_TAIL = 4000  # characters of the child's messages kept for a failure it did not write to the run folder


def command_for(config_path: Path | None, resume: Path | None, gpus: list[int], data_changed: str) -> list[str]:
    """The `hone train` command line that trains on `gpus` (their indices are made the only visible ones)."""
    command = [sys.executable, "-m", "hone.core.cli", "train"]
    if config_path is not None:
        command.append(str(config_path))
    if resume is not None:
        command += ["--resume", str(resume)]
        if data_changed != "refuse":
            command += ["--data-changed", data_changed]
    return [*command, "--gpus", str(len(gpus))]


def train_on_gpus(config: RunConfig, control: RunControl, resume: Path | None = None, *, gpus: list[int],
                  data_changed: str = "refuse") -> Iterator[events.Event]:
    """Train `config` (or go on with the run in `resume`, as its config.toml says) on the GPUs `gpus`, yielding
    the run's events as they are written. Ends with RunFinished or RunFailed, as Trainer.run does."""
    if os.name != "posix":
        raise HoneError("training on several GPUs at once runs on Linux", "tick one GPU")
    if resume is not None:
        run_dir, config_path = Path(resume), None
    else:  # a new run's folder is made here, so its events can be read; process 0 takes it as it is (empty)
        run_dir = new_run_dir(config)
        config = config.with_overrides([f"output.name={json.dumps(run_dir.name)}",
                                        f"output.runs_dir={json.dumps(str(run_dir.parent))}"])
    with tempfile.TemporaryDirectory(prefix="hone-gpus-") as scratch:
        if resume is None:
            config_path = Path(scratch) / CONFIG_FILE
            config.save(config_path)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(i) for i in gpus))
        stderr_path = Path(scratch) / "stderr.txt"
        with open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(command_for(config_path, resume, gpus, data_changed), env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                     start_new_session=True)
            follower = _Follower(child, run_dir, control, started=time.time())
            yield from follower.events()
            ended = child.returncode
        said = stderr_path.read_text(encoding="utf-8", errors="replace")
    if not follower.ended:
        yield events.RunFailed(
            reason=_last_message(said) or f"training on {len(gpus)} GPUs ended without finishing (exit code {ended})",
            advice="see the messages below; the run folder keeps its checkpoints (Resume on the Runs page)",
            details=said[-STDERR_TAIL:])


class _Follower:
    """The run's events from this start on, until the child exits; asks it to stop once when `control` says so.
    `ended`: whether the run wrote its own RunFinished or RunFailed."""

    def __init__(self, child: subprocess.Popen, run_dir: Path, control: RunControl, started: float):
        self.child, self.control, self.started = child, control, started
        self.tail = EventTail(run_dir)
        self.ended = False

    def events(self) -> Iterator[events.Event]:
        asked = False
        while True:
            running = self.child.poll() is None
            for event in self.tail.read():
                if event.time >= self.started:  # a resumed run's folder holds the earlier starts' events too
                    self.ended = self.ended or isinstance(event, (events.RunFinished, events.RunFailed))
                    yield event
            if not running:
                return
            if self.control.stop_requested and not asked:
                self.child.send_signal(signal.SIGINT)
                asked = True
            time.sleep(POLL_S)


def _last_message(said: str) -> str:
    """The child's own one-line error (`hone: error: ...`), if it ended with one."""
    lines = [line for line in said.splitlines() if line.startswith("hone: error: ")]
    return lines[-1].removeprefix("hone: error: ") if lines else ""

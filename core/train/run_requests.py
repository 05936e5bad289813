"""Pause and stop a run that another process trains, knowing only its folder: how a reopened Studio window reaches
the run it left training.

Pause goes through a file in the run folder: a run the Studio started (hone.core.train.child_run) pauses while
RUN_DIR/pause.request exists (`control.PAUSE_FILE_ENV` names it; run.lock's note says so, `run_lock.RunLock`). Stop
is the Ctrl-C every `hone train` takes as "stop after this step and save": SIGINT to the process holding the folder's
lock, on this computer, for a run of one process (torchrun's processes stop together through their launcher).
Stdlib only.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from hone.core.train.run_lock import in_use, read_holder

PAUSE_REQUEST = "pause.request"


def pause_request_file(run_dir: str | Path) -> Path:
    """The file whose existence pauses the run a Studio started in `run_dir` (an absolute path)."""
    return Path(os.path.abspath(run_dir)) / PAUSE_REQUEST


def _holder_here(run_dir: str | Path) -> dict:
    """run.lock's note when a live process of this computer holds the folder, else {}."""
    holder = read_holder(run_dir)
    if not holder or holder.get("host") != socket.gethostname() or in_use(run_dir) is not True:
        return {}
    return holder


def can_pause(run_dir: str | Path) -> bool:
    """Whether the process training `run_dir` watches the folder's pause file (a run the Studio started)."""
    return _holder_here(run_dir).get("pause_file") == str(pause_request_file(run_dir))


def request_pause(run_dir: str | Path, paused: bool) -> None:
    """Ask the run in `run_dir` to pause after its current step (`paused`), or to go on; it says so in its
    metrics.jsonl (RunPaused, RunResumed)."""
    path = pause_request_file(run_dir)
    if paused:
        path.touch()
    else:
        path.unlink(missing_ok=True)


def can_stop(run_dir: str | Path, processes: int = 1) -> bool:
    """Whether `request_stop` can reach the process training `run_dir`: one process (`processes`, RunStarted's), on
    this computer, on a system with SIGINT."""
    holder = _holder_here(run_dir)
    return os.name == "posix" and processes == 1 and bool(holder) and holder.get("pid") != os.getpid()


def request_stop(run_dir: str | Path) -> bool:
    """Ask the process training `run_dir` to stop after its current step; it saves a checkpoint and the adapter
    first. False when no process of this computer trains it (it ended meanwhile)."""
    pid = _holder_here(run_dir).get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, signal.SIGINT)
    except OSError:
        return False
    return True

"""A run in a child process for a caller that reads events (the studio): `hone train` (with `--gpus N` on several
GPUs) started as a process of its own, its events read back from the run folder as it writes them.

The child outlives its caller: a run started this way keeps training when the studio closes (`RunControl.detach`
ends the reading, not the run), and the studio follows it again from the Runs page. Stdlib only: the caller never
imports torch for it. Stop asks the child to stop after the current step: a run of one process through a stop file
it watches (`control.STOP_FILE_ENV`; the same on Windows, where there is no SIGINT to send), a run on several GPUs
(Linux) with SIGINT, which the launcher passes on through the processes' stop file. Pause creates a file the child
watches (`control.PAUSE_FILE_ENV`, in the run folder, where a later window finds it: hone.core.train.run_requests)
and Resume removes it; a run on several GPUs does not pause (its processes would wait for each other in the
gradient exchange).

A run that fails before its first step removes the folder it made, RunFailed and all, usually before the next look
at it; a child refused before its run writes no event. Its failure then comes from what it recorded in its failure
file or printed on its error output (held whole here), in its own words (`unread_failure`); a folder made here that
the child never wrote to is removed once it has ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import PAUSE_FILE_ENV, STOP_FILE_ENV, RunControl
from hone.core.errors import FAILURE_FILE_ENV, HoneError, recorded_failure
from hone.core.train.run_dir import CONFIG_FILE, METRICS_FILE, EventTail, new_run_dir
from hone.core.train.run_requests import pause_request_file

POLL_S = 0.5
STDERR_TAIL = 4000  # characters of the child's messages kept for a failure it did not write to the run folder
# Columns the child's console is told it has: wide enough that it prints every message on one line (rich wraps at 80
# columns when its output is a file), so the failure it printed is read back word for word.
CONSOLE_COLUMNS = 100_000
# How `hone train` prints a failure on its error output: a run's RunFailed (hone.core.cli.console.EventPrinter), or a
# refusal before the run (hone.core.cli.dispatch); each reason line may be followed by its advice line.
_REASON_PREFIXES = {"failed: ": False, "interrupted: ": True, "hone: error: ": False}  # -> the run was interrupted
_ADVICE_PREFIXES = ("advice: ", "hone: advice: ")
# The advice of a child that ended without saying why (killed, out of memory): its output is all there is.
_NO_WORDS_ADVICE = "see the messages below; the run folder keeps its checkpoints (Resume on the Runs page)"

# The child outlives its caller and ignores the caller's console: its own session (POSIX); on Windows its own
# process group, and no console window of its own popping up beside the Studio (it is stopped through its stop file).
_ON_ITS_OWN: dict = (
    {"start_new_session": True}
    if os.name == "posix"
    else {
        "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0) | getattr(subprocess, "CREATE_NO_WINDOW", 0)
    }
)


def command_for(config_path: Path | None, resume: Path | None, gpus: list[int], data_changed: str) -> list[str]:
    """The `hone train` command line of the run (on `gpus`, whose indices are made the only visible ones)."""
    command = [sys.executable, "-m", "hone.core.cli", "train"]
    if config_path is not None:
        command.append(str(config_path))
    if resume is not None:
        command += ["--resume", str(resume)]
        if data_changed != "refuse":
            command += ["--data-changed", data_changed]
    return [*command, "--gpus", str(len(gpus))] if len(gpus) > 1 else command


def train_in_child(
    config: RunConfig,
    control: RunControl,
    resume: Path | None = None,
    *,
    gpus: list[int] | None = None,
    data_changed: str = "refuse",
) -> Iterator[events.Event]:
    """Train `config` (or go on with the run in `resume`, as its config.toml says) in a child process, on the GPUs
    `gpus` (None: what the child sees), yielding the run's events as they are written. Ends with RunFinished or
    RunFailed, as Trainer.run does, or with nothing more once `control` is detached."""
    gpus = list(gpus or [])
    if os.name != "posix" and len(gpus) > 1:  # several GPUs need NCCL, and stopping them SIGINT
        raise HoneError("training on several GPUs at once needs Linux", "tick one GPU")
    if resume is not None:
        run_dir = Path(resume)
        # settings of its own (a longer run): given as `hone train CONFIG --resume RUN_DIR`, else the run's config.toml
        config_path = None if _same_config(config, run_dir) else _config_beside(config, run_dir)
    else:  # a new run's folder is made here, so its events can be read; the child takes it as it is (empty)
        run_dir = new_run_dir(config)
        config = config.with_overrides(
            [f"output.name={json.dumps(run_dir.name)}", f"output.runs_dir={json.dumps(str(run_dir.parent))}"]
        )
        config_path = _config_beside(config, run_dir)
    env = dict(os.environ, COLUMNS=str(CONSOLE_COLUMNS))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    talk = Path(tempfile.mkdtemp(prefix="hone-child-"))  # files the child and this process share
    failure_file = talk / "failure.json"  # a refusal before the run folder is written: its code survives
    env[FAILURE_FILE_ENV] = str(failure_file)
    pause_file = stop_file = None
    if len(gpus) <= 1:  # one process: it pauses while this file exists, in the run folder so a later window finds it
        pause_file = pause_request_file(run_dir)
        pause_file.unlink(missing_ok=True)  # left by a run killed while paused: this one starts running
        env[PAUSE_FILE_ENV] = str(pause_file)
        stop_file = talk / "stop.request"  # and stops once this one exists
        env[STOP_FILE_ENV] = str(stop_file)
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            command_for(config_path, resume, gpus, data_changed),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            **_ON_ITS_OWN,
        )
        follower = _Follower(child, run_dir, control, started=time.time(), pause_file=pause_file, stop_file=stop_file)
        try:
            yield from follower.events()
        finally:
            failure = recorded_failure(failure_file) or {}
            # a run left behind (detached) trains on, its pause file in its folder (hone.core.train.run_requests); a
            # failure it writes is lost
            shutil.rmtree(talk, ignore_errors=True)
            if pause_file is not None and not follower.detached and child.poll() is not None:
                pause_file.unlink(missing_ok=True)  # a run stopped while paused leaves no request behind
            # the child has read its config once it writes the run's events (or has ended)
            if config_path is not None and (child.poll() is not None or (run_dir / METRICS_FILE).exists()):
                config_path.unlink(missing_ok=True)
            if resume is None and not follower.detached and child.poll() is not None:
                _remove_if_empty(run_dir)  # made here for a child that ended before it wrote to it
        if follower.detached:
            return
        stderr.seek(0)
        said = stderr.read().decode("utf-8", errors="replace")
    if not follower.ended:
        yield unread_failure(failure, said, child.returncode)


class _Follower:
    """The run's events from this start on, until the child exits or `control` is detached; asks the child to
    stop once when `control` says so, and to pause while it says so (through `pause_file`, when the child has one).
    `ended`: whether the run wrote its own RunFinished or RunFailed."""

    def __init__(
        self,
        child: subprocess.Popen,
        run_dir: Path,
        control: RunControl,
        started: float,
        pause_file: Path | None = None,
        stop_file: Path | None = None,
    ):
        self.child, self.control, self.started, self.pause_file = child, control, started, pause_file
        self.stop_file = stop_file
        self.tail = EventTail(run_dir)
        self.ended = self.detached = False

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
            if self.control.detached:
                self.detached = True
                return
            if self.control.stop_requested and not asked:
                if self.stop_file is not None:
                    self.stop_file.touch()
                else:
                    self.child.send_signal(signal.SIGINT)
                asked = True
            if self.pause_file is not None and self.control.paused != self.pause_file.exists():
                if self.control.paused:
                    self.pause_file.touch()
                else:
                    self.pause_file.unlink(missing_ok=True)
            time.sleep(POLL_S)


def _config_beside(config: RunConfig, run_dir: Path) -> Path:
    """`config` saved beside the run folder, not in it (the child takes only an empty folder for a new run); kept if
    the caller detaches before the child has read it."""
    handle, name = tempfile.mkstemp(prefix=f".{run_dir.name}-", suffix=".toml", dir=run_dir.parent)
    os.close(handle)
    config.save(Path(name))
    return Path(name)


def _same_config(config: RunConfig, run_dir: Path) -> bool:
    """Whether `config` is the run folder's config.toml (a config.toml it cannot read: the child says why)."""
    try:
        return RunConfig.load(run_dir / CONFIG_FILE) == config
    except Exception:  # any damage is the child's to report, with the file named
        return True


def unread_failure(recorded: dict, said: str, returncode: int | None) -> events.RunFailed:
    """The RunFailed of a child that ended without one its reader got, in the child's own words.

    A run that fails before it starts writes its RunFailed to the run folder and then removes the folder (it made
    it, and nothing was trained), often before the reader's next look; a refusal before the run (a wrong path, data
    changed under a resume) writes no event at all. What the child recorded in its failure file comes first (it
    keeps the code a front end acts on), then the failure it printed last on its error output (read whole, so never
    too late), then its exit code.

    Args:
        recorded: what the child wrote to its failure file (`hone.core.errors.recorded_failure`), or {}.
        said: everything the child printed on its error output.
        returncode: the child's exit status.
    """
    message, advice = _text(recorded.get("message")), _text(recorded.get("advice"))
    interrupted = False
    if not message:
        message, advice, interrupted = printed_failure(said)
    return events.RunFailed(
        reason=message or f"the training process ended without finishing (exit code {returncode})",
        advice=advice if message else _NO_WORDS_ADVICE,
        details=said[-STDERR_TAIL:],
        code=_text(recorded.get("code")),
        interrupted=interrupted,
    )


def printed_failure(said: str) -> tuple[str, str, bool]:
    """(reason, advice, interrupted) of the last failure the child printed on its error output `said` (the
    line-prefixed forms of _REASON_PREFIXES, the advice on the line after); ("", "", False) when it printed none."""
    lines = said.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        prefix = next((p for p in _REASON_PREFIXES if lines[index].startswith(p)), None)
        if prefix is None:
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        advice = next((following.removeprefix(p) for p in _ADVICE_PREFIXES if following.startswith(p)), "")
        return lines[index].removeprefix(prefix).strip(), advice.strip(), _REASON_PREFIXES[prefix]
    return "", "", False


def _text(value) -> str:
    """A field of the failure file as text: the child wrote it, but the file sits in a shared temporary folder."""
    return value.strip() if isinstance(value, str) else ""


def _remove_if_empty(run_dir: Path) -> None:
    """Remove the run folder made for a child that wrote nothing to it; a folder with anything in it stays."""
    with contextlib.suppress(OSError):  # not empty (the run's files), or already gone (the child removed it)
        run_dir.rmdir()

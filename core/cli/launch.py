"""`hone train --gpus N`: torchrun started once, running `hone train` in one process per GPU.

Ctrl-C reaches this launcher only (torchrun runs in a session of its own): it creates a stop file whose path the
processes are given, and each stops after its current step, saving a checkpoint and the adapter. A signal sent
through torchrun instead would arrive twice (the terminal's, then torchrun's own), and a second Ctrl-C means
abort. A second Ctrl-C here ends torchrun and its processes at once. SIGTERM and SIGHUP (the system's requests to
end, hone.core.cli.stop_signals) stop them the same way, end them once the grace period is over, and the launcher
then exits with EXIT_STOPPED_BY_SYSTEM.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from hone.core.cli.stop_signals import DEFAULT_GRACE_S, EXIT_STOPPED_BY_SYSTEM
from hone.core.control import STOP_FILE_ENV, check_control_file
from hone.core.errors import HoneError

STOP_POLL_S = 0.5
# Under a plain torchrun, Ctrl-C reaches each process from the terminal and again from torchrun: two SIGINTs
# closer than this are one keypress.
SAME_KEYPRESS_S = 2.0


def launched_by_torchrun(env=os.environ) -> bool:
    return "RANK" in env and "WORLD_SIZE" in env


def wanted(args) -> bool:
    """Whether `hone train` should start torchrun (several GPUs or machines asked for, and not already under it);
    a request this machine cannot serve is refused here, before anything loads."""
    if args.gpus < 1 or args.nnodes < 1:
        raise HoneError("--gpus and --nnodes count from 1", "give the number of GPUs (or machines) to train on")
    if not 0 <= args.node_rank < args.nnodes:
        raise HoneError(
            f"--node-rank {args.node_rank} is not one of the {args.nnodes} machines (0 to {args.nnodes - 1})",
            "number the machines from 0; machine 0 is --master-addr",
        )
    if args.nnodes > 1 and not args.master_addr:
        raise HoneError("--nnodes > 1 needs --master-addr", "give the address of machine 0 (--node-rank 0)")
    if launched_by_torchrun() or (args.gpus == 1 and args.nnodes == 1):
        return False
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < args.gpus:
        raise HoneError(
            f"--gpus {args.gpus} asks for {args.gpus} NVIDIA GPUs, and this machine has {found}",
            f"use --gpus {found}" if found > 1 else "train on one process: drop --gpus",
        )
    return True


def torchrun_command(args, python: str = sys.executable) -> list[str]:
    """torchrun running `hone train` per GPU with this command's own arguments."""
    command = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(args.gpus)]
    if args.nnodes == 1:
        command.append("--standalone")  # a free port of its own: two runs on one machine do not collide
    else:
        command += [
            "--nnodes",
            str(args.nnodes),
            "--node-rank",
            str(args.node_rank),
            "--master-addr",
            args.master_addr,
            "--master-port",
            str(args.master_port),
        ]
    command += ["-m", __package__, "train"]  # this package, run as `hone`
    if args.config:
        command.append(args.config)
    for override in args.overrides:
        command += ["--set", override]
    if args.resume:
        command += ["--resume", args.resume]
    if args.data_changed:
        command += ["--data-changed", args.data_changed]
    if getattr(args, "rerun", None):
        command += ["--rerun", args.rerun]
    return command


def run_torchrun(args, grace_s: float = DEFAULT_GRACE_S) -> int:
    """Run torchrun to the end; its exit code (EXIT_STOPPED_BY_SYSTEM when the system asked it to end). Ctrl-C,
    SIGTERM and SIGHUP ask the processes to stop at a step boundary; a second one, or `grace_s` seconds after the
    system's, ends them."""
    console = Console(stderr=True)
    stop_dir = Path(tempfile.mkdtemp(prefix="hone-stop-"))
    stop_file = stop_dir / "stop"
    env = dict(os.environ, **{STOP_FILE_ENV: str(stop_file)})
    process = subprocess.Popen(torchrun_command(args), env=env, start_new_session=True)
    asked: list[tuple[int, float]] = []  # (signal, when) of each request

    def on_request(signum, frame):
        asked.append((signum, time.monotonic()))
        if len(asked) > 1:  # the second request: end them now
            os.killpg(process.pid, signal.SIGTERM)
            return
        stop_file.touch()
        console.print(
            "stopping after the current step (a checkpoint and the adapter are saved); Ctrl-C again "
            "ends the processes now"
        )

    wired = [s for s in (signal.SIGINT, getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s]
    previous = {sig: signal.signal(sig, on_request) for sig in wired}
    try:
        code = _wait_for_torchrun(process, asked, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)
        stop_dir.rmdir()
    by_system = any(sig != signal.SIGINT for sig, _ in asked)
    if code != 0 and not by_system:
        console.print(
            f"[red]training on {args.gpus * args.nnodes} processes failed[/red] (torchrun exit code "
            f"{code}): the process that failed says why above, marked [process N]; the run folder keeps "
            "its checkpoints (`hone train --resume RUN_DIR` goes on)"
        )
    return EXIT_STOPPED_BY_SYSTEM if by_system else code


def _wait_for_torchrun(process: subprocess.Popen, asked: list[tuple[int, float]], grace_s: float) -> int:
    """torchrun's exit code; once the system asked to stop, the processes are ended after `grace_s` seconds."""
    while True:
        try:
            return process.wait(timeout=STOP_POLL_S)
        except subprocess.TimeoutExpired:
            system = [when for sig, when in asked if sig != signal.SIGINT]
            if system and time.monotonic() - system[0] > grace_s:
                os.killpg(process.pid, signal.SIGTERM)
                grace_s = math.inf  # once


def watch_stop_file(control, path: str | None) -> threading.Thread | None:
    """Stop `control` once the launcher creates `path` (checked every STOP_POLL_S seconds).

    Raises:
        HoneError: `path` (STOP_FILE_ENV's value) cannot be a file the launcher creates (`check_control_file`).
    """
    path = check_control_file(STOP_FILE_ENV, path)
    if not path:
        return None

    def watch() -> None:
        while not control.stop_requested:
            if os.path.isfile(path):
                control.stop()
                return
            time.sleep(STOP_POLL_S)

    thread = threading.Thread(target=watch, name="hone-stop-file", daemon=True)
    thread.start()
    return thread


class StopOnInterrupt:
    """The SIGINT handler of a training process: the first Ctrl-C stops at a step boundary, a later one aborts.
    Under torchrun one keypress arrives twice (from the terminal and from torchrun), so a repeat within
    SAME_KEYPRESS_S seconds counts as the same one."""

    def __init__(self, control, merge_repeats: bool):
        self.control, self.merge_repeats = control, merge_repeats
        self.first: float | None = None

    def __call__(self, signum, frame) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
            self.control.stop()
        elif not (self.merge_repeats and now - self.first < SAME_KEYPRESS_S):
            raise KeyboardInterrupt


class PeerEnded(HoneError):
    """torchrun ended this process (SIGTERM): it does so to the others when one process of a run fails."""


def stopped_by_torchrun(signum, frame) -> None:
    from hone.core.api import PEER_ADVICE

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # once; a second one ends the process
    raise PeerEnded("another process of this run stopped, and torchrun ended this one", PEER_ADVICE)


def print_run(run, printer) -> None:
    """Hand each event of the generator `run` to `printer`. torchrun's SIGTERM raises PeerEnded wherever this
    process is; arriving while the printer works, it is thrown into the run, which reports it as its failure."""
    pending = None
    while True:
        try:
            event = run.throw(pending) if pending is not None else next(run)
        except StopIteration:
            return
        except PeerEnded:  # it reached the run as it was ending: what it had to say is said
            return
        pending = None
        try:
            printer.handle(event)
        except PeerEnded as e:
            pending = e


class FailurePrinter:
    """What a process other than 0 prints: only its failure, marked with its number (process 0 prints the run)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.last = None
        self.console = Console(stderr=True)

    def __enter__(self) -> FailurePrinter:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def handle(self, event) -> None:
        from hone.core.events import RunFailed

        self.last = event
        if isinstance(event, RunFailed):
            mark = escape(f"[process {self.rank}]")
            self.console.print(
                f"{mark} [red]run failed:[/red] {escape(event.reason)}\n{mark} {escape(event.advice)}", soft_wrap=True
            )
            if event.details:
                self.console.print(event.details, markup=False, highlight=False)

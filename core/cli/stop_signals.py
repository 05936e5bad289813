"""Every way a system asks `hone train` to end, wired to one stop: save at the next step boundary, then exit.

POSIX: Ctrl-C (SIGINT) is the user's stop; SIGTERM (kill, docker stop, a scheduler) and SIGHUP (a closed terminal or
SSH session) are the system's. Windows: Ctrl-C stays Python's SIGINT; the console's Ctrl-Break, close, logoff and
shutdown events (SetConsoleCtrlHandler) are the system's, and the handler holds Windows off until the save is done.

The first request stops the run after its current step: it saves a checkpoint and the adapter and ends "stopped".
A system's stop then exits with EXIT_STOPPED_BY_SYSTEM; a user's keeps the exit code of a finished run. A second
request ends the process at once (checkpoint saves are atomic: the last complete one stays), and so does a step
still in flight GRACE_ENV seconds after a system's request, though never in the middle of a save. Under torchrun,
SIGTERM means another process failed (`launch.stopped_by_torchrun`) and keeps that meaning.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from hone.core.control import env_error, env_text

# `hone train`'s exit code when the system asked it to end (EX_TEMPFAIL of sysexits.h): the run ended early and goes
# on with `hone train --resume RUN_DIR`. 0: finished, or stopped by the user; 1: failed; 2: refused; 130: 2 Ctrl-Cs.
EXIT_STOPPED_BY_SYSTEM = 75
GRACE_ENV = "HONE_STOP_GRACE_S"
# How long a step in flight may take to reach its boundary after a system's request. Schedulers send SIGKILL after
# their own grace (docker stop: 10 s, Kubernetes: 30 s, Slurm's KillWait: 30 s), so a longer step ends with the last
# complete checkpoint either way; 60 s lets a long step of a large model finish where the system waits that long.
DEFAULT_GRACE_S = 60.0
MAX_GRACE_S = 24 * 3600.0
# Under a plain torchrun, Ctrl-C reaches each process from the terminal and again from torchrun: two SIGINTs
# closer than this are one keypress.
SAME_KEYPRESS_S = 2.0
USER, SYSTEM = "user", "system"  # who asked: the user's Ctrl-C, or the system (a signal, the console, the session)
RESUME_HINT = "the run goes on from its last complete checkpoint: `hone train --resume {run_dir}`"

# Windows console control events (wincon.h). Windows ends the process once the handler returns, or when its own
# time runs out: 5 s after a close, 20 s after a logoff or shutdown (less a margin for the exit itself).
CTRL_C_EVENT, CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT = 0, 1, 2, 5, 6
CONSOLE_WAIT_S = {CTRL_CLOSE_EVENT: 4.5, CTRL_LOGOFF_EVENT: 19.0, CTRL_SHUTDOWN_EVENT: 19.0}


def grace_seconds() -> float:
    """GRACE_ENV's value (seconds, from 0 to a day), DEFAULT_GRACE_S when unset.

    Raises:
        HoneError: a value that is not a number of seconds in that range, naming the variable.
    """
    value = env_text(GRACE_ENV)
    if value is None:
        return DEFAULT_GRACE_S
    accepts = f"a number of seconds from 0 to {MAX_GRACE_S:.0f} (default {DEFAULT_GRACE_S:.0f})"
    try:
        seconds = float(value)
    except ValueError:
        raise env_error(GRACE_ENV, value, accepts) from None
    if not 0 <= seconds <= MAX_GRACE_S:  # also refuses nan
        raise env_error(GRACE_ENV, value, accepts)
    return seconds


class StopRequests:
    """What each request to end means for one training process; `arrived` may be called from any thread.

    Args:
        control: the run's RunControl; the first request stops it after the current step.
        saving: held by the trainer while it writes a checkpoint or the adapter; the grace period waits for it.
        merge_repeats: under torchrun, a second Ctrl-C within SAME_KEYPRESS_S is the same keypress.
        run_dir: where the run lives, for the message (a callable: the folder is known once the run opened it).
        exit_now, interrupt_main, say: how the process ends at once (os._exit), how a user's second Ctrl-C aborts
            (KeyboardInterrupt in the main thread), where the message goes; tests put their own.
    """

    def __init__(
        self,
        control,
        *,
        saving: contextlib.AbstractContextManager | None = None,
        merge_repeats: bool = False,
        grace_s: float = DEFAULT_GRACE_S,
        run_dir: Callable[[], str] = lambda: "RUN_DIR",
        exit_now: Callable[[int], object] = os._exit,
        interrupt_main: Callable[[], object] = _thread.interrupt_main,
        say: Callable[[str], object] = lambda text: print(f"hone: {text}", file=sys.stderr, flush=True),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.control, self.merge_repeats, self.grace_s = control, merge_repeats, grace_s
        self.saving = saving if saving is not None else contextlib.nullcontext()
        self.run_dir, self.exit_now, self.interrupt_main = run_dir, exit_now, interrupt_main
        self.say, self.clock = say, clock
        self.first: float | None = None
        self.by_system = False  # some request came from the system: the process exits EXIT_STOPPED_BY_SYSTEM
        self.done = threading.Event()  # the run has ended (its saves are written): set by `finished`
        self.aborting = False  # the user's second Ctrl-C: the main thread's SIGINT handler raises KeyboardInterrupt
        self._lock = threading.Lock()
        self.grace_thread: threading.Thread | None = None

    def arrived(self, by: str) -> None:
        """A request to end from `by` (USER or SYSTEM)."""
        with self._lock:
            if self.aborting:  # the user's abort is on its way to the main thread
                return
            now, earlier = self.clock(), self.first
            first = earlier is None
            if earlier is None:
                self.first = now
            elif by == USER and not self.by_system and self.merge_repeats and now - earlier < SAME_KEYPRESS_S:
                return
            self.by_system = self.by_system or by == SYSTEM
            if first:
                self.control.stop()
                if by == SYSTEM:
                    self.say(
                        "asked to end: stopping after the current step (a checkpoint and the adapter are saved; at "
                        f"most {self.grace_s:g} s, {GRACE_ENV}); a second request ends at once"
                    )
                    self.grace_thread = threading.Thread(target=self._grace, name="hone-stop-grace", daemon=True)
                    self.grace_thread.start()
                return
        self._end_now("asked again to end: ending now")

    def finished(self) -> None:
        """The run has ended: the grace period has nothing left to cut, and its thread ends here. Its target holds
        the trainer (through `run_dir`); left running into the interpreter's exit, it could drop the last reference
        to the model's tensors there, and torch aborts a process that frees tensors while it finalizes."""
        self.done.set()
        grace = self.grace_thread
        if grace is not None and grace is not threading.current_thread():
            grace.join(timeout=5.0)  # returns at once: `done` ends its wait, and a save in flight has finished

    @property
    def exit_code(self) -> int | None:
        """EXIT_STOPPED_BY_SYSTEM once the system asked the run to end; None otherwise (the run's own code)."""
        return EXIT_STOPPED_BY_SYSTEM if self.by_system else None

    def _end_now(self, why: str) -> None:
        if not self.by_system:  # the user's second Ctrl-C aborts as it always has (KeyboardInterrupt: exit 130)
            self.aborting = True
            self.interrupt_main()  # runs the SIGINT handler in the main thread (`on_interrupt`), which raises it
            return
        self.say(f"{why}; {RESUME_HINT.format(run_dir=self.run_dir())}")
        self.exit_now(EXIT_STOPPED_BY_SYSTEM)

    def on_interrupt(self, signum, frame) -> None:
        """The Python-level SIGINT handler (the main thread): raises KeyboardInterrupt once the user aborts; on
        Windows it also passes Ctrl-C on (on POSIX the watcher thread does, from the wakeup pipe)."""
        if self.aborting:
            raise KeyboardInterrupt
        if os.name == "nt":
            self.arrived(USER)

    def _grace(self) -> None:
        if self.done.wait(self.grace_s):
            return
        with self.saving:  # a checkpoint or the adapter being written is finished first
            if not self.done.is_set():
                self._end_now(f"the step in flight did not end within {self.grace_s:g} s ({GRACE_ENV}): ending now")


# ---- POSIX: signals ----

SIGNALS = {"SIGINT": USER, "SIGTERM": SYSTEM, "SIGHUP": SYSTEM}


@contextlib.contextmanager
def posix_signals(requests: StopRequests, *, launched: bool, peer_ended: Callable | None = None) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP to `requests` while the block runs; under torchrun (`launched`), SIGTERM to
    `peer_ended` instead. The signals are read from a wakeup pipe on a thread of their own, so a second signal or the
    grace period ends the process even while the main thread is inside one long call (a step's kernel)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    kinds = {getattr(signal, name): by for name, by in SIGNALS.items() if hasattr(signal, name)}
    if launched:
        kinds.pop(signal.SIGTERM, None)
    previous = {sig: signal.getsignal(sig) for sig in kinds}
    for sig in kinds:  # a Python handler must exist for the C handler to write the signal to the pipe
        signal.signal(sig, requests.on_interrupt if sig == signal.SIGINT else _noted)
    if launched and peer_ended is not None:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, peer_ended)
    old_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch() -> None:
        while chunk := os.read(read_end, 64):
            for number in chunk:
                if number == _WATCH_ENDS:
                    return
                if number in kinds:
                    requests.arrived(kinds[number])

    thread = threading.Thread(target=watch, name="hone-signals", daemon=True)
    thread.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        # The watcher returns (a forked worker still alive would keep the pipe open: no end of file to wait for),
        # and is joined, so it never holds `requests` (and through it the trainer) into the interpreter's exit.
        with contextlib.suppress(OSError):
            os.write(write_end, bytes([_WATCH_ENDS]))
        os.close(write_end)
        thread.join(timeout=5.0)
        os.close(read_end)


_WATCH_ENDS = 0  # the byte that ends the watcher: no signal has the number 0


def _noted(signum, frame) -> None:
    """The Python-level handler of a signal the watcher thread acts on."""


# ---- Windows: console control events ----


class ConsoleEvents:
    """The console control handler: Ctrl-Break, close, logoff and shutdown ask `requests` to stop; for the last three
    Windows ends the process when the handler returns, so it first waits (CONSOLE_WAIT_S) for the run to end.
    Ctrl-C is left to Python's SIGINT handler (returns False: not handled here)."""

    def __init__(self, requests: StopRequests, waits: dict[int, float] | None = None):
        self.requests = requests
        self.waits = CONSOLE_WAIT_S if waits is None else waits

    def __call__(self, event: int) -> bool:
        if event == CTRL_C_EVENT:
            return False
        if event not in (CTRL_BREAK_EVENT, *self.waits):
            return False
        self.requests.arrived(SYSTEM)
        if event in self.waits:
            self.requests.done.wait(self.waits[event])
        return True


@contextlib.contextmanager
def windows_console(requests: StopRequests, kernel32=None, functype=None) -> Iterator[ConsoleEvents]:
    """ConsoleEvents installed with SetConsoleCtrlHandler while the block runs. `kernel32` and `functype` (how a
    Python function becomes a HandlerRoutine pointer) are ctypes' own on Windows; tests give theirs."""
    import ctypes

    handler = ConsoleEvents(requests)
    if kernel32 is None:
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    routine = (functype or ctypes.WINFUNCTYPE)(ctypes.c_int, ctypes.c_ulong)  # type: ignore[attr-defined]
    callback = routine(lambda event: 1 if handler(int(event)) else 0)  # kept alive while installed
    kernel32.SetConsoleCtrlHandler(callback, True)
    try:
        yield handler
    finally:
        kernel32.SetConsoleCtrlHandler(callback, False)


@contextlib.contextmanager
def stop_requests_wired(requests: StopRequests, *, launched: bool, peer_ended: Callable | None = None):
    """Every way this OS asks the process to end, wired to `requests` while the block runs."""
    if os.name == "nt":
        previous = signal.signal(signal.SIGINT, requests.on_interrupt)
        try:
            with windows_console(requests):
                yield requests
        finally:
            signal.signal(signal.SIGINT, previous)
    else:
        with posix_signals(requests, launched=launched, peer_ended=peer_ended):
            yield requests

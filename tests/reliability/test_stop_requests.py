"""The stop logic of `hone train` (hone.core.cli.stop_signals) and of the `--gpus N` launcher, in this process: which
request stops, which ends at once and with what code, the grace period (which never cuts a save), real POSIX
signals through the wakeup pipe, and the Windows console handler with its ctypes layer put in by the test (a
real-Windows test runs `hone train` and sends it Ctrl-Break)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace

import pytest

from hone.core.cli import launch, stop_signals
from hone.core.cli.stop_signals import (
    CTRL_BREAK_EVENT,
    CTRL_C_EVENT,
    CTRL_CLOSE_EVENT,
    CTRL_LOGOFF_EVENT,
    CTRL_SHUTDOWN_EVENT,
    EXIT_STOPPED_BY_SYSTEM,
    SYSTEM,
    USER,
    ConsoleEvents,
    StopRequests,
)
from hone.core.control import RunControl
from hone.core.errors import HoneError

posix = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


class Ends:
    """What StopRequests did to end the process, instead of doing it."""

    def __init__(self):
        self.exits: list[tuple[int, float]] = []
        self.interrupts = 0
        self.said: list[str] = []
        self.exited = threading.Event()

    def requests(self, control: RunControl, **kwargs) -> StopRequests:
        return StopRequests(
            control,
            exit_now=self.exit_now,
            interrupt_main=self.interrupt_main,
            say=self.said.append,
            run_dir=lambda: "runs/r",
            **kwargs,
        )

    def exit_now(self, code: int) -> None:
        self.exits.append((code, time.monotonic()))
        self.exited.set()

    def interrupt_main(self) -> None:
        self.interrupts += 1


def test_the_user_s_ctrl_c_stops_then_aborts_and_keeps_the_run_s_exit_code():
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=0.05)
    requests.arrived(USER)
    assert control.stop_requested and requests.exit_code is None and requests.grace_thread is None
    requests.arrived(USER)  # the second Ctrl-C: KeyboardInterrupt in the main thread, as before (exit 130)
    assert ends.interrupts == 1 and requests.aborting and ends.exits == []
    with pytest.raises(KeyboardInterrupt):
        requests.on_interrupt(signal.SIGINT, None)
    requests.arrived(SYSTEM)  # nothing more once aborting
    assert ends.exits == [] and ends.interrupts == 1


def test_under_torchrun_one_keypress_arriving_twice_is_one_request():
    control, ends = RunControl(), Ends()
    now = [100.0]
    requests = ends.requests(control, merge_repeats=True, clock=lambda: now[0])
    requests.arrived(USER)
    now[0] += stop_signals.SAME_KEYPRESS_S / 2
    requests.arrived(USER)  # the terminal's and torchrun's copy of one Ctrl-C
    assert ends.interrupts == 0
    now[0] += stop_signals.SAME_KEYPRESS_S
    requests.arrived(USER)
    assert ends.interrupts == 1


def test_a_system_request_stops_and_a_second_request_of_any_kind_ends_at_once_with_75():
    for second in (SYSTEM, USER):
        control, ends = RunControl(), Ends()
        requests = ends.requests(control, grace_s=60.0)
        requests.arrived(SYSTEM)
        assert control.stop_requested and requests.exit_code == EXIT_STOPPED_BY_SYSTEM
        assert "at most 60 s" in ends.said[0] and stop_signals.GRACE_ENV in ends.said[0]
        requests.arrived(second)
        assert [code for code, _ in ends.exits] == [EXIT_STOPPED_BY_SYSTEM] and ends.interrupts == 0
        assert "hone train --resume runs/r" in ends.said[-1]
        requests.finished()


def test_the_run_s_end_joins_the_grace_thread_before_the_interpreter_exits():
    """The grace thread's target holds the trainer (through `run_dir`): were it still running when the interpreter
    finalizes, it would drop the last reference to the model's tensors there, and torch aborts the process
    ("terminate called without an active exception", exit -6 instead of 75)."""
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=60.0)
    requests.arrived(SYSTEM)
    grace = requests.grace_thread
    assert grace is not None and grace.is_alive()
    requests.finished()
    assert not grace.is_alive() and ends.exits == []


def test_a_user_stop_then_a_system_request_ends_at_once():
    control, ends = RunControl(), Ends()
    requests = ends.requests(control)
    requests.arrived(USER)
    requests.arrived(SYSTEM)
    assert [code for code, _ in ends.exits] == [EXIT_STOPPED_BY_SYSTEM]


def test_the_grace_period_ends_a_step_in_flight_but_never_a_save():
    # No step boundary within the grace period: the process ends once it is over.
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=0.2)
    asked = time.monotonic()
    requests.arrived(SYSTEM)
    assert ends.exited.wait(5.0)
    assert ends.exits[0][0] == EXIT_STOPPED_BY_SYSTEM and 0.2 <= ends.exits[0][1] - asked < 2.0
    assert "did not end within 0.2 s" in ends.said[-1]

    # A save under way when the period is over is finished first.
    control, ends, saving = RunControl(), Ends(), threading.RLock()
    requests = ends.requests(control, grace_s=0.1, saving=saving)
    with saving:
        requests.arrived(SYSTEM)
        time.sleep(0.5)
        assert ends.exits == []
        released = time.monotonic()
    assert ends.exited.wait(5.0) and ends.exits[0][1] >= released

    # The run ended (saved) within the period: nothing is cut.
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=0.2)
    requests.arrived(SYSTEM)
    requests.finished()
    requests.grace_thread.join(5.0)
    assert ends.exits == []


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, stop_signals.DEFAULT_GRACE_S), ("", stop_signals.DEFAULT_GRACE_S), ("2.5", 2.5)]
)
def test_the_grace_period_comes_from_hone_stop_grace_s(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(stop_signals.GRACE_ENV, raising=False)
    else:
        monkeypatch.setenv(stop_signals.GRACE_ENV, value)
    assert stop_signals.grace_seconds() == seconds


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e9"])
def test_a_grace_period_hone_cannot_use_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(stop_signals.GRACE_ENV, value)
    with pytest.raises(HoneError) as refused:
        stop_signals.grace_seconds()
    assert stop_signals.GRACE_ENV in refused.value.message and repr(value) in refused.value.message


@posix
def test_real_signals_reach_the_requests_through_the_wakeup_pipe_and_are_put_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=60.0)
    with stop_signals.stop_requests_wired(requests, launched=False):
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5.0
        while not control.stop_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert control.stop_requested and requests.by_system
        os.kill(os.getpid(), signal.SIGTERM)
        assert ends.exited.wait(5.0) and ends.exits[0][0] == EXIT_STOPPED_BY_SYSTEM
        requests.finished()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup pipe left behind


@posix
def test_a_second_ctrl_c_raises_keyboard_interrupt_in_the_main_thread():
    control, ends = RunControl(), Ends()
    requests = StopRequests(control, say=ends.said.append)  # the real interrupt_main
    with pytest.raises(KeyboardInterrupt), stop_signals.stop_requests_wired(requests, launched=False):
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5.0
        while not control.stop_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert control.stop_requested and not requests.by_system
        os.kill(os.getpid(), signal.SIGINT)
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert requests.exit_code is None


@posix
def test_under_torchrun_sigterm_still_means_another_process_failed():
    control, ends = RunControl(), Ends()
    requests = ends.requests(control)
    wired = stop_signals.stop_requests_wired(requests, launched=True, peer_ended=launch.stopped_by_torchrun)
    with pytest.raises(launch.PeerEnded), wired:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2.0)
    assert not control.stop_requested and ends.exits == []


# ---- Windows: the console handler, its ctypes layer put in by the test ----


def test_console_close_logoff_and_shutdown_stop_the_run_and_wait_for_its_save():
    for event in (CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT):
        control, ends = RunControl(), Ends()
        requests = ends.requests(control, grace_s=60.0)
        handler = ConsoleEvents(requests, waits={CTRL_CLOSE_EVENT: 5.0, CTRL_LOGOFF_EVENT: 5.0, CTRL_SHUTDOWN_EVENT: 5})
        threading.Timer(0.3, requests.finished).start()  # the run saves and ends 0.3 s later
        started = time.monotonic()
        assert handler(event) is True
        took = time.monotonic() - started
        assert control.stop_requested and requests.by_system and 0.3 <= took < 3.0, (event, took)

    # Windows will not wait for ever: nor does the handler.
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=60.0)
    started = time.monotonic()
    assert ConsoleEvents(requests, waits={CTRL_CLOSE_EVENT: 0.2})(CTRL_CLOSE_EVENT) is True
    assert 0.2 <= time.monotonic() - started < 2.0
    requests.finished()


def test_console_break_stops_at_once_and_ctrl_c_is_left_to_python():
    control, ends = RunControl(), Ends()
    requests = ends.requests(control, grace_s=60.0)
    handler = ConsoleEvents(requests)
    assert handler(CTRL_C_EVENT) is False and not control.stop_requested  # Python's SIGINT handler takes it
    assert handler(3) is False  # no such event
    started = time.monotonic()
    assert handler(CTRL_BREAK_EVENT) is True and time.monotonic() - started < 0.5
    assert control.stop_requested and requests.exit_code == EXIT_STOPPED_BY_SYSTEM
    requests.finished()


def test_the_console_handler_is_installed_through_set_console_ctrl_handler_and_removed():
    class Kernel32:
        def __init__(self):
            self.calls = []

        def SetConsoleCtrlHandler(self, callback, add):
            self.calls.append((callback, add))
            return 1

    kernel32, control, ends = Kernel32(), RunControl(), Ends()
    requests = ends.requests(control, grace_s=60.0)
    with stop_signals.windows_console(requests, kernel32, functype=ctypes.CFUNCTYPE):
        ((callback, added),) = kernel32.calls
        assert added is True
        assert callback(CTRL_BREAK_EVENT) == 1 and control.stop_requested  # through the C function pointer
        assert callback(CTRL_C_EVENT) == 0
    assert kernel32.calls[-1] == (callback, False)
    requests.finished()


@pytest.mark.skipif(os.name != "nt", reason="the Windows console")
@pytest.mark.slow
def test_ctrl_break_stops_hone_train_on_windows(tiny_model_dir, tmp_path):
    import json

    from hone.core.demo.text_data import make_dataset
    from hone.core.train.run_dir import read_events
    from tests.core.conftest import make_tiny_config, write_rows

    rows, _ = make_dataset(n_train=24, n_eval=4, seed=3)
    train = write_rows(tmp_path / "train.jsonl", rows)
    settings = ["train.max_steps=5000", "data.max_length=128", "train.batch_tokens=128", "output.name=w"]
    config = make_tiny_config(tiny_model_dir("tiny-dense"), (train, train), tmp_path / "runs", *settings)
    config.save(tmp_path / "r.toml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hone.core.cli", "train", str(tmp_path / "r.toml")],
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,  # type: ignore[attr-defined]
    )
    run_dir = tmp_path / "runs" / "w"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any(type(e).__name__ == "StepMetrics" for e in read_events(run_dir)):
        time.sleep(0.1)
    proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
    assert proc.wait(120) == EXIT_STOPPED_BY_SYSTEM
    assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped"


# ---- `hone train --gpus N`: the launcher ----

# Stands in for torchrun: says it started, then ends 0 once the launcher creates the stop file (or never, "hang").
FAKE_TORCHRUN = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1]).touch()\n"
    "stop = pathlib.Path(os.environ['HONE_STOP_FILE'])\n"
    "while sys.argv[2] == 'hang' or not stop.exists():\n"
    "    time.sleep(0.05)\n"
)


@posix
@pytest.mark.parametrize(("behaviour", "grace"), [("stops", 60.0), ("hang", 0.5)])
def test_the_launcher_passes_a_system_request_on_and_exits_75(monkeypatch, tmp_path, behaviour, grace):
    started = tmp_path / "started"
    command = [sys.executable, "-c", FAKE_TORCHRUN, str(started), behaviour]
    monkeypatch.setattr(launch, "torchrun_command", lambda args: command)
    before = signal.getsignal(signal.SIGTERM)

    def send():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=send, daemon=True).start()
    began = time.monotonic()
    code = launch.run_torchrun(Namespace(gpus=2, nnodes=1), grace)
    assert code == EXIT_STOPPED_BY_SYSTEM
    assert time.monotonic() - began < 30
    assert signal.getsignal(signal.SIGTERM) == before

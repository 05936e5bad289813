"""A benchmark peer in a process of its own: importing unsloth patches transformers and TRL globally, so its runs
never share a process with Hone's or the reference's. The parent writes a JSON spec, runs
`python -m MODULE SPEC.json RESULT.json` and reads the JSON the child answers with: {"result": ...}, or
{"error": ..., "details": ...} when the run inside failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# Loading, patching and training a model in the child; it bounds one benchmark run there.
TIMEOUT_S = 1800
# How often the parent looks whether the child has ended (it reads the child's own resource use as it reaps it).
POLL_S = 0.2
GIB = 1024**3


class PeerFailed(RuntimeError):
    """The peer process could not run or measure its steps; the message says why."""


def run_child(module: str, spec: dict, *, who: str, timeout_s: int = TIMEOUT_S) -> dict:
    """Run `python -m module` on `spec` and return the dict it wrote.

    Raises:
        PeerFailed: the child ran past `timeout_s`, exited without an answer (its last lines say why), or answered
            with an error.
    """
    with tempfile.TemporaryDirectory(prefix="hone-bench-peer-") as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        output = Path(folder) / "output.txt"
        with output.open("w+", encoding="utf-8", errors="replace") as sink:
            command = [sys.executable, "-m", module, str(spec_path), str(result_path)]
            returncode, peak_rss = _run_and_reap(command, sink, timeout_s, who)
            sink.seek(0)
            said = sink.read()
        if not result_path.is_file():
            raise PeerFailed(_exit_words(who, returncode, peak_rss, _last_lines(said)))
        answer = json.loads(result_path.read_text(encoding="utf-8"))
    if "result" not in answer:
        raise PeerFailed(f"{who} failed: {answer.get('error')}\n{answer.get('details', '')}")
    return answer["result"]


def _run_and_reap(command: list[str], sink, timeout_s: int, who: str) -> tuple[int, int | None]:
    """Run the child with its output in `sink`; (its exit status, its peak resident memory in bytes where the
    platform reports it per child: `os.wait4`, not on Windows)."""
    child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    if not hasattr(os, "wait4"):
        try:
            return child.wait(timeout=timeout_s), None
        except subprocess.TimeoutExpired:
            raise PeerFailed(f"the {who} process ran past {timeout_s} s") from None
        finally:  # past its time, or Ctrl-C here: the child goes too
            if child.poll() is None:
                child.kill()
                child.wait()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
                # ru_maxrss: kibibytes on Linux, bytes on macOS
                return child.returncode, usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
            if time.monotonic() > deadline:
                raise PeerFailed(f"the {who} process ran past {timeout_s} s")
            time.sleep(POLL_S)
    except BaseException:  # past its time, or Ctrl-C here: the child (and the GPU memory it holds) goes too
        if child.returncode is None:
            child.kill()
            os.wait4(child.pid, 0)
            child.returncode = -signal.SIGKILL
        raise


def _last_lines(output: str, count: int = 5) -> str:
    """The child's last lines of output, progress bars left out (they say nothing about why it ended)."""
    lines = [line for line in output.replace("\r", "\n").splitlines() if line.strip() and "it/s]" not in line]
    return " | ".join(line.strip() for line in lines[-count:])


def _exit_words(who: str, returncode: int, peak_rss: int | None, tail: str) -> str:
    """Why the child gave no answer, in words: the signal that ended it, and, for SIGKILL, its peak resident memory
    beside the host's RAM (the kernel's out-of-memory killer sends SIGKILL when RAM runs out)."""
    if returncode >= 0:
        return f"the {who} process exited with {returncode}: {tail}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    said = f"the {who} process was killed by {name}"
    if peak_rss is not None:
        from hone.core.machine.telemetry import system_memory

        _, total = system_memory()
        said += f" at a peak of {peak_rss / GIB:.1f} GiB resident"
        if total:
            said += f", on a host with {total / GIB:.1f} GiB of RAM"
    if name == "SIGKILL":
        said += " (SIGKILL with no error of its own: most often the kernel's out-of-memory killer, or a time limit)"
    return f"{said}; its last lines: {tail}"


def answer_child(argv: list[str], work: Callable[[dict], dict]) -> int:
    """The child's side: read the spec named by argv[0], write what `work` returns to argv[1], or the error it
    raised with its traceback (the parent raises it as PeerFailed)."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        answer = {"result": work(spec)}
    except Exception as e:
        answer = {"error": f"{type(e).__name__}: {e}", "details": traceback.format_exc()[-20000:]}
    Path(argv[1]).write_text(json.dumps(answer), encoding="utf-8")
    return 0

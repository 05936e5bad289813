"""A benchmark peer in a process of its own: importing unsloth patches transformers and TRL globally, so its runs
never share a process with Hone's or the reference's. The parent writes a JSON spec, runs
`python -m MODULE SPEC.json RESULT.json` and reads the JSON the child answers with: {"result": ...}, or
{"error": ..., "details": ...} when the run inside failed.
"""

from __future__ import annotations

import json
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
# How often the parent looks at the child: whether it has ended, and its resident memory so far.
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
            returncode, peak_rss = _run_watched(command, sink, timeout_s, who)
            sink.seek(0)
            said = sink.read()
        if not result_path.is_file():
            raise PeerFailed(_exit_words(who, returncode, peak_rss, _last_lines(said)))
        answer = json.loads(result_path.read_text(encoding="utf-8"))
    if "result" not in answer:
        raise PeerFailed(f"{who} failed: {answer.get('error')}\n{answer.get('details', '')}")
    return answer["result"]


def _run_watched(command: list[str], sink, timeout_s: int, who: str) -> tuple[int, int | None]:
    """Run the child with its output in `sink`; (its exit status, the highest resident memory seen in bytes, where
    the system shows it: Linux's VmHWM, read as the child runs, since the resource use a parent gets back for a
    child counts the parent's own memory copied at the fork)."""
    child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    peak = None
    try:
        while True:
            seen = _high_water_mark(child.pid)
            peak = max(peak or 0, seen) if seen is not None else peak
            try:
                return child.wait(timeout=POLL_S), peak
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise PeerFailed(f"the {who} process ran past {timeout_s} s") from None
    finally:  # past its time, or Ctrl-C here: the child (and the GPU memory it holds) goes too
        if child.poll() is None:
            child.kill()
            child.wait()


def _high_water_mark(pid: int) -> int | None:
    """The peak resident memory of a running process (bytes), from /proc/PID/status; None where there is none."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _last_lines(output: str, count: int = 5) -> str:
    """The child's last lines of output, progress bars left out (they say nothing about why it ended)."""
    lines = [line for line in output.replace("\r", "\n").splitlines() if line.strip() and "it/s]" not in line]
    return " | ".join(line.strip() for line in lines[-count:])


def _exit_words(who: str, returncode: int, peak_rss: int | None, tail: str) -> str:
    """Why the child gave no answer, in words: the signal that ended it, its peak resident memory as last seen beside
    the host's RAM (the kernel's out-of-memory killer sends SIGKILL when RAM runs out)."""
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
        said += f" at a peak of {peak_rss / GIB:.1f} GiB resident (as last seen)"
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

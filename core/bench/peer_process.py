"""A benchmark peer in a process of its own: importing unsloth patches transformers and TRL globally, so its runs
never share a process with Hone's or the reference's. The parent writes a JSON spec, runs
`python -m MODULE SPEC.json RESULT.json` and reads the JSON the child answers with: {"result": ...}, or
{"error": ..., "details": ...} when the run inside failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

# Loading, patching and training a model in the child; it bounds one benchmark run there.
TIMEOUT_S = 1800


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
        try:
            done = subprocess.run(
                [sys.executable, "-m", module, str(spec_path), str(result_path)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise PeerFailed(f"the {who} process ran past {timeout_s} s") from None
        if not result_path.is_file():
            tail = " | ".join((done.stderr or done.stdout or "").strip().splitlines()[-5:])
            raise PeerFailed(f"the {who} process exited with {done.returncode}: {tail}")
        answer = json.loads(result_path.read_text(encoding="utf-8"))
    if "result" not in answer:
        raise PeerFailed(f"{who} failed: {answer.get('error')}\n{answer.get('details', '')}")
    return answer["result"]


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

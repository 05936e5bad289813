"""What a run folder holds, by name, the run.json summary's fields, and making a new folder.

Every module that reads or writes a run folder names its files through the constants here (run_dir.py writes
them, run_history.py reads them back). Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.errors import HoneError

# What RUN_DIR holds:
CONFIG_FILE = "config.toml"  # the RunConfig the run used
# Every event, one JSON object per line, each step once: append-only while a run goes (a write that fails is cut
# back, a partial last line from a kill is cut when the folder is opened again), and on resume the lines of steps
# after the checkpoint, trained again, are dropped (`RunWriter.forget_steps_after`).
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "train.log"  # human-readable log: the run's setup, steps, evals, checkpoints, the outcome (`log_lines`)
SUMMARY_FILE = "run.json"  # summary: status, steps, losses, paths (rewritten atomically)
ADAPTER_DIR = "adapter"  # the final PEFT adapter folder (adapter_dir.py)
CHECKPOINTS_DIR = "checkpoints"  # step-NNNNNN/ resumable states (checkpoints.py)
# run.lock: who trains in the folder now (run_lock.py)
INTERRUPTED = "interrupted"  # a run that says running, read back while no process trains it
DAMAGED = "damaged"  # a run whose run.json cannot be read (read_summary says why)
# What run.json may say. A run is written running, then finished, stopped, failed or interrupted (a GPU that stopped
# working); interrupted is also what a run that says running is read back as once no process trains it.
STATUSES = ("running", "finished", "stopped", "failed", INTERRUPTED)


@dataclass
class RunSummary:
    """What the run history shows for one run (from run.json)."""

    run_dir: str
    name: str
    model: str
    status: str  # running | finished | stopped | failed; read back, also interrupted (live_summary) or damaged
    step: int = 0
    total_steps: int = 0
    final_loss: float | None = None
    eval_loss: float | None = None
    started: float = 0.0
    updated: float = 0.0
    reason: str = ""  # why it failed, or why it is damaged

    @property
    def has_adapter(self) -> bool:
        return (Path(self.run_dir) / ADAPTER_DIR / "adapter_config.json").is_file()

    @property
    def advice(self) -> str:
        """What to do about a damaged run ("" for any other)."""
        if self.status != DAMAGED:
            return ""
        return (
            "the run's checkpoints and adapter are untouched: `hone train --resume "
            f"{self.run_dir}` still works if its config.toml and a checkpoint are intact (and writes run.json anew); "
            "or delete the folder"
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "run"


# The longest path Hone writes inside a run folder, with room to spare (an export's staging folder holding a
# sharded model: exports/.merged-bf16.partial-XXXXXXXX/merged-bf16/model-00001-of-00002.safetensors).
_LONGEST_INSIDE = 120


def check_run_path(run_dir: Path) -> None:
    """Refuse a run folder whose path, or a name in it, is longer than this system allows, or leaves no room for the
    files a run writes inside it, before anything is written.

    Raises:
        HoneError: naming the path, its length and the system's limit.
    """
    path = Path(os.path.abspath(run_dir))
    existing = next(p for p in (path, *path.parents) if os.path.exists(p))  # False for a name too long
    name_max, path_max = 255, 260  # Windows without long paths; NTFS names
    if hasattr(os, "pathconf"):
        with contextlib.suppress(OSError, ValueError):
            name_max = os.pathconf(existing, "PC_NAME_MAX")
            path_max = os.pathconf(existing, "PC_PATH_MAX")
    long_name = next((part for part in path.parts if len(part.encode("utf-8")) > name_max), None)
    if long_name is not None:
        raise HoneError(
            f"the run folder {path} has a name of {len(long_name.encode('utf-8'))} bytes in its path "
            f"({long_name[:40]}...), and this file system allows {name_max}",
            "choose a shorter output.name or output.runs_dir",
        )
    size = len(str(path).encode("utf-8"))
    if size + _LONGEST_INSIDE >= path_max:
        raise HoneError(
            f"the run folder's path is {size} bytes long ({path}); with the {_LONGEST_INSIDE} the files inside it "
            f"need, that passes this system's limit of {path_max}",
            f"choose output.runs_dir and output.name so that the run folder's path stays under "
            f"{path_max - _LONGEST_INSIDE} bytes",
        )


def new_run_dir(config: RunConfig) -> Path:
    """A fresh folder under output.runs_dir: output.name, or date-time plus model name; never reuses a folder.

    Raises:
        HoneError: the folder's path is too long for this system (`check_run_path`); nothing is made then.
    """
    root = Path(config.output.runs_dir).expanduser()
    model = Path(config.model.name_or_path.replace(":", "/")).name
    base = config.output.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(model)}"
    candidate, n = root / base, 2
    check_run_path(candidate)
    while candidate.exists() and any(candidate.iterdir()):
        candidate, n = root / f"{base}-{n}", n + 1
    check_run_path(candidate)
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate

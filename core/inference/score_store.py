"""A run's stored scores: RUN_DIR/scores.json, one entry per checkpoint step and one for the base, per data file.

    {"hone_scores": 1, "entries": [
        {"checkpoint": 20,                      a step of checkpoints/step-N, or null for the base model
         "weights_sha256": "…",                 the checkpoint's trainable.safetensors (its manifest's sha256), or
                                                the base model's name for the base
         "data": {"path": "/…/eval.jsonl", "sha256": "…", "rows": 20},
         "metrics": {"loss": 1.93, "perplexity": 6.9, "exact": 0.4, "normalized": 0.45, "f1": 0.61,
                     "contains": 0.5, "json_valid": null},
         "scored": "2026-12-05T14:03:11Z"}, …]}

An entry is reused when the same checkpoint weights were scored on the same rows of the same file (its sha256), so
`hone eval --checkpoints` scores each checkpoint once and the Studio shows scores without a model. The file is
replaced whole (write beside, flush, rename), so a kill leaves the old scores or the new ones. A file that cannot be
read, or whose entries have other types, is reported as damaged (`StoredScores.damage`) and its usable entries kept;
the next scoring writes it afresh. Stdlib only: the Studio reads scores without torch.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError
from hone.core.events import quoted
from hone.core.train import json_checks
from hone.core.train.run_dir import CHECKPOINTS_DIR
from hone.core.train.safe_writes import write_json_atomic

SCORES_FILE = "scores.json"
_FORMAT = 1
# One entry is ~400 bytes; 64 MB holds over 100,000 of them. A larger file is not Hone's.
MAX_SCORES_BYTES = 64 << 20
# A checkpoint's manifest lists four files; one of over a megabyte is not Hone's.
_MAX_MANIFEST_BYTES = 1 << 20

# metric -> (what it is, lower is better)
METRICS: dict[str, tuple[str, bool]] = {
    "loss": ("held-out loss: mean cross-entropy per reference token", True),
    "perplexity": ("exp(held-out loss)", True),
    "exact": ("share of answers equal to the reference (ends' whitespace ignored)", False),
    "normalized": ("share of answers equal to the reference once case, punctuation and spacing are ignored", False),
    "f1": ("mean word F1 of the answers against the references", False),
    "contains": ("share of answers that contain the reference (normalized)", False),
    "json_valid": ("share of valid JSON answers, over the rows whose reference is JSON", False),
}
DEFAULT_METRIC = "loss"


@dataclass(frozen=True)
class DataKey:
    """The rows scores were computed on: a file (absolute path and sha256) and how many of its rows were scored."""

    path: str
    sha256: str
    rows: int

    def describe(self) -> str:
        return f"{self.rows} rows of {self.path} (sha256 {self.sha256[:12]})"

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "rows": self.rows}


@dataclass(frozen=True)
class ScoreEntry:
    """One model scored on one data: `checkpoint` is a step, or None for the base model.

    Attributes:
        weights_sha256: the checkpoint's trainable.safetensors sha256 (its manifest's), or the base model's name:
            an entry is reused only for the same weights.
        metrics: METRICS' names -> value (json_valid None when no reference is JSON).
        scored: when, UTC, ISO 8601.
    """

    checkpoint: int | None
    weights_sha256: str
    data: DataKey
    metrics: dict[str, float | None]
    scored: str

    @property
    def label(self) -> str:
        return "base" if self.checkpoint is None else f"step {self.checkpoint}"

    def same_key(self, other: ScoreEntry) -> bool:
        return (self.checkpoint, self.weights_sha256, self.data) == (other.checkpoint, other.weights_sha256, other.data)

    def as_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "weights_sha256": self.weights_sha256,
            "data": self.data.as_dict(),
            "metrics": dict(self.metrics),
            "scored": self.scored,
        }


@dataclass
class StoredScores:
    """What RUN_DIR/scores.json holds: its usable entries, and why it is damaged ("" when it is not)."""

    path: Path
    entries: list[ScoreEntry] = field(default_factory=list)
    damage: str = ""

    def find(self, checkpoint: int | None, weights_sha256: str, data: DataKey) -> ScoreEntry | None:
        return next(
            (
                e
                for e in self.entries
                if e.checkpoint == checkpoint and e.weights_sha256 == weights_sha256 and e.data == data
            ),
            None,
        )


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _metric_rule(value: Any) -> str:
    return "" if value is None else json_checks.finite(value)


_ENTRY_RULES: dict[str, json_checks.Rule] = {
    "checkpoint": json_checks.optional(json_checks.count),
    "weights_sha256": json_checks.text,
    "data": json_checks.an_object,
    "metrics": json_checks.an_object,
    "scored": json_checks.text,
}
_DATA_RULES: dict[str, json_checks.Rule] = {
    "path": json_checks.text,
    "sha256": json_checks.text,
    "rows": json_checks.count,
}


def _entry(raw: Any, where: str) -> tuple[ScoreEntry | None, list[str]]:
    """An entry of the file, or None and what is wrong with it (each field named)."""
    if not isinstance(raw, dict):
        return None, [f"{where} is {quoted(raw)}, not an object"]
    problems = json_checks.field_problems(raw, _ENTRY_RULES, required=tuple(_ENTRY_RULES), prefix=f"{where}.")
    if problems:
        return None, problems
    data, metrics = raw["data"], raw["metrics"]
    problems = json_checks.field_problems(data, _DATA_RULES, required=tuple(_DATA_RULES), prefix=f"{where}.data.")
    known = {name: metrics[name] for name in METRICS if name in metrics}
    problems += json_checks.field_problems(known, dict.fromkeys(known, _metric_rule), prefix=f"{where}.metrics.")
    if problems:
        return None, problems
    return (
        ScoreEntry(
            checkpoint=raw["checkpoint"],
            weights_sha256=raw["weights_sha256"],
            data=DataKey(data["path"], data["sha256"], data["rows"]),
            metrics={name: None if v is None else float(v) for name, v in known.items()},
            scored=raw["scored"],
        ),
        [],
    )


def read_scores(run_dir: str | Path) -> StoredScores:
    """RUN_DIR/scores.json's entries (none when there is no such file); a damaged file or entry is described in
    `damage` (the file's name, the entry and the field), never raised."""
    path = Path(run_dir) / SCORES_FILE
    stored = StoredScores(path)
    stored.entries, stored.damage = read_entries(path, MAX_SCORES_BYTES, _entry)
    return stored


def read_entries(path: Path, max_bytes: int, parse) -> tuple[list, str]:
    """The usable entries of a JSON file {"entries": [...]} and what is damaged in it ("" when nothing; no file:
    no entries). `parse(item, where)` -> (entry or None, problems) reads one entry."""
    try:
        raw = json_checks.read_object(path, max_bytes)
    except json_checks.Damaged as e:
        return [], f"{path} {e}"
    if raw is None:
        return [], ""
    items = raw.get("entries")
    if not isinstance(items, list):
        return [], f"{path} is damaged: entries is {quoted(items)}, not a list"
    entries: list = []
    problems: list[str] = []
    for i, item in enumerate(items):
        entry, wrong = parse(item, f"entries[{i}]")
        problems += wrong
        if entry is not None:
            entries.append(entry)
    if not problems:
        return entries, ""
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return entries, f"{path} is damaged: {'; '.join(problems[:3])}{more}"


def store_scores(run_dir: str | Path, new: list[ScoreEntry]) -> Path:
    """Add `new` to RUN_DIR/scores.json (an entry of the same checkpoint, weights and data is replaced), writing the
    file whole. A damaged file is replaced by its usable entries and the new ones."""
    stored = read_scores(run_dir)
    kept = [e for e in stored.entries if not any(e.same_key(n) for n in new)]
    write_json_atomic(stored.path, {"hone_scores": _FORMAT, "entries": [e.as_dict() for e in kept + new]})
    return stored.path


def checkpoint_weights(run_dir: str | Path) -> dict[int, str]:
    """step -> the sha256 of its trainable.safetensors, for each checkpoints/step-N folder whose manifest lists one
    (read, not verified: hone.core.train.checkpoints verifies before weights load)."""
    found: dict[int, str] = {}
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return found
    for folder in root.iterdir():
        digits = folder.name[len("step-") :]
        if not (folder.name.startswith("step-") and digits.isdigit() and folder.is_dir()):
            continue
        try:
            manifest = json_checks.read_object(folder / "manifest.json", _MAX_MANIFEST_BYTES)
        except json_checks.Damaged:
            continue
        files = manifest.get("files") if manifest else None
        entry = files.get("trainable.safetensors") if isinstance(files, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if isinstance(sha, str):
            found[int(digits)] = sha
    return dict(sorted(found.items()))


def current_entries(stored: StoredScores, weights: dict[int, str]) -> list[ScoreEntry]:
    """The checkpoint entries whose checkpoint is still in the run folder with the weights that were scored."""
    return [e for e in stored.entries if e.checkpoint is not None and weights.get(e.checkpoint) == e.weights_sha256]


def latest_data(entries: list[ScoreEntry]) -> DataKey | None:
    """The data of the most recently scored checkpoint entry: what "best" is picked on when none is named."""
    checkpoints = [e for e in entries if e.checkpoint is not None]
    return max(checkpoints, key=lambda e: e.scored).data if checkpoints else None


def check_metric(name: str) -> str:
    """`name` when it is a metric scores hold. Raises HoneError naming the metrics there are."""
    if name not in METRICS:
        raise HoneError(f"there is no metric {name!r}", f"choose one of: {', '.join(METRICS)}")
    return name


def best_entry(entries: list[ScoreEntry], by: str = DEFAULT_METRIC) -> ScoreEntry | None:
    """The checkpoint entry (never the base's) with the best value of `by` (lowest for a loss, highest for a share);
    on a tie the earliest step. None when no checkpoint entry has that metric."""
    check_metric(by)
    lower = METRICS[by][1]
    scored = [
        e
        for e in entries
        if e.checkpoint is not None and e.metrics.get(by) is not None and math.isfinite(e.metrics[by] or 0.0)
    ]
    if not scored:
        return None
    return min(scored, key=lambda e: ((e.metrics[by] or 0.0) * (1 if lower else -1), e.checkpoint))


def best_stored(run_dir: str | Path, by: str = DEFAULT_METRIC) -> ScoreEntry:
    """The best checkpoint by `by` among the stored scores of the checkpoints still in the run folder, on the data
    scored most recently.

    Raises:
        HoneError: no checkpoint still there has stored scores (saying to run `hone eval RUN --checkpoints all`), or
            none of them has `by`.
    """
    run_dir = Path(run_dir)
    check_metric(by)
    stored = read_scores(run_dir)
    entries = current_entries(stored, checkpoint_weights(run_dir))
    data = latest_data(entries)
    damaged = f" ({stored.damage})" if stored.damage else ""
    if data is None:
        raise HoneError(
            f"run {run_dir.name} has no stored scores for the checkpoints it holds{damaged}",
            f"score them first: `hone eval {run_dir} --checkpoints all`",
        )
    best = best_entry([e for e in entries if e.data == data], by)
    if best is None:
        raise HoneError(
            f"no stored checkpoint score of run {run_dir.name} on {data.describe()} has {by}",
            f"pick by another metric (one of {', '.join(METRICS)})",
        )
    return best


def stored_for_step(run_dir: str | Path, step: int) -> ScoreEntry | None:
    """The most recent stored scores of checkpoint `step` as it is now in the run folder; None when there are none."""
    entries = [e for e in current_entries(read_scores(run_dir), checkpoint_weights(run_dir)) if e.checkpoint == step]
    return max(entries, key=lambda e: e.scored) if entries else None

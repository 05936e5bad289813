"""A run's lm-eval task scores: RUN_DIR/lm_eval_scores.json, one entry per model (the base, the fine-tune), task and
setting, beside the checkpoint scores of scores.json.

    {"hone_lm_eval_scores": 1, "entries": [
        {"model": "tuned",                        "base", or "tuned": the base with the run's adapter
         "weights": "adapter:…",                  the adapter file's sha256, or "base:<model>" for the base
         "task": "gsm8k",                         the task or group lm-eval reports (a tag is stored as its tasks)
         "limit": 200,                            rows per task asked for; null: every row
         "num_fewshot": 5,                        examples in each prompt (the task's own unless --num-fewshot)
         "chat_template": false,                  the prompts went through the run's chat template (--chat-template)
         "system_instruction": null,              the system message before each prompt (--system-instruction)
         "samples": 200,                          rows scored (a group: all of its tasks')
         "metrics": {"exact_match,strict-match": 0.12, …},   lm-eval's "metric,filter" names and values
         "stderr": {"exact_match,strict-match": 0.023, …},   their standard errors, where lm-eval gives one
         "task_version": "3.0", "lm_eval": "0.4.13", "scored": "2026-12-05T14:03:11Z"}, …]}

Scoring the same model, weights, task, limit, shots, chat template and system instruction again replaces that entry;
entries of other settings stay (an entry written before Hone recorded the chat template reads as raw text). The
file is replaced whole (write beside, flush, rename), so a kill leaves the old scores or the new ones. A file that
cannot be read, or whose entries have other types, is reported as damaged (`StoredTaskScores.damage`) and its usable
entries kept. Stdlib only: the Studio reads it without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.events import quoted
from hone.core.inference.score_store import read_entries
from hone.core.train import json_checks
from hone.core.train.safe_writes import write_json_atomic

LM_EVAL_SCORES_FILE = "lm_eval_scores.json"
_FORMAT = 1
# An entry is ~600 bytes (a group's, with its tasks' metrics, a few kB); 64 MB holds tens of thousands. A larger file
# is not Hone's.
MAX_TASK_SCORES_BYTES = 64 << 20
MODELS = ("base", "tuned")


@dataclass(frozen=True)
class TaskScore:
    """One model scored on one lm-eval task (or group).

    Attributes:
        model: "base" or "tuned".
        weights: what the model's weights are known by: "adapter:<sha256 of the adapter file>" or "base:<model>".
        task: the name lm-eval reports it by.
        limit: rows per task asked for; None = every row.
        num_fewshot: examples in each prompt.
        samples: rows scored.
        metrics: lm-eval's "metric,filter" name -> value (None where lm-eval gave no finite number).
        stderr: the same names -> standard error, where lm-eval computed one.
        task_version: the task's version as lm-eval gives it.
        lm_eval: lm-eval's version.
        scored: when, UTC, ISO 8601.
        chat_template: the prompts went through the tokenizer's chat template (solved examples as earlier turns);
            False: lm-eval's raw text, as published leaderboards score.
        system_instruction: the system message put before each prompt; None: none.
    """

    model: str
    weights: str
    task: str
    limit: int | None
    num_fewshot: int | None
    samples: int
    metrics: dict[str, float | None]
    stderr: dict[str, float]
    task_version: str
    lm_eval: str
    scored: str
    chat_template: bool = False
    system_instruction: str | None = None

    def same_key(self, other: TaskScore) -> bool:
        return self._key() == other._key()

    def _key(self) -> tuple:
        return (
            self.model,
            self.weights,
            self.task,
            self.limit,
            self.num_fewshot,
            self.chat_template,
            self.system_instruction,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "weights": self.weights,
            "task": self.task,
            "limit": self.limit,
            "num_fewshot": self.num_fewshot,
            "chat_template": self.chat_template,
            "system_instruction": self.system_instruction,
            "samples": self.samples,
            "metrics": dict(self.metrics),
            "stderr": dict(self.stderr),
            "task_version": self.task_version,
            "lm_eval": self.lm_eval,
            "scored": self.scored,
        }


@dataclass
class StoredTaskScores:
    """What RUN_DIR/lm_eval_scores.json holds: its usable entries, and why it is damaged ("" when it is not)."""

    path: Path
    entries: list[TaskScore] = field(default_factory=list)
    damage: str = ""


def _numbers(value: Any) -> str:
    """An object of finite numbers (null allowed: a metric lm-eval could not compute)."""
    if not isinstance(value, dict):
        return "not an object"
    wrong = [k for k, v in value.items() if v is not None and json_checks.finite(v)]
    return f"not a number at {wrong[0]!r}" if wrong else ""


_ENTRY_RULES: dict[str, json_checks.Rule] = {
    "model": json_checks.one_of(MODELS),
    "weights": json_checks.text,
    "task": json_checks.text,
    "limit": json_checks.optional(json_checks.count),
    "num_fewshot": json_checks.optional(json_checks.count),
    "samples": json_checks.count,
    "metrics": _numbers,
    "stderr": _numbers,
    "task_version": json_checks.text,
    "lm_eval": json_checks.text,
    "scored": json_checks.text,
    # Written since --chat-template came; an older entry has neither, and was scored on raw text without one.
    "chat_template": json_checks.flag,
    "system_instruction": json_checks.optional(json_checks.text),
}
_REQUIRED = tuple(name for name in _ENTRY_RULES if name not in ("chat_template", "system_instruction"))


def _entry(raw: Any, where: str) -> tuple[TaskScore | None, list[str]]:
    """An entry of the file, or None and what is wrong with it (each field named)."""
    if not isinstance(raw, dict):
        return None, [f"{where} is {quoted(raw)}, not an object"]
    problems = json_checks.field_problems(raw, _ENTRY_RULES, required=_REQUIRED, prefix=f"{where}.")
    if problems:
        return None, problems
    return (
        TaskScore(
            model=raw["model"],
            weights=raw["weights"],
            task=raw["task"],
            limit=raw["limit"],
            num_fewshot=raw["num_fewshot"],
            samples=raw["samples"],
            metrics={str(k): None if v is None else float(v) for k, v in raw["metrics"].items()},
            stderr={str(k): float(v) for k, v in raw["stderr"].items() if v is not None},
            task_version=raw["task_version"],
            lm_eval=raw["lm_eval"],
            scored=raw["scored"],
            chat_template=raw.get("chat_template", False),
            system_instruction=raw.get("system_instruction"),
        ),
        [],
    )


def read_task_scores(run_dir: str | Path) -> StoredTaskScores:
    """RUN_DIR/lm_eval_scores.json's entries (none when there is no such file); a damaged file or entry is described
    in `damage` (the file's name, the entry and the field), never raised."""
    path = Path(run_dir) / LM_EVAL_SCORES_FILE
    stored = StoredTaskScores(path)
    stored.entries, stored.damage = read_entries(path, MAX_TASK_SCORES_BYTES, _entry)
    return stored


def store_task_scores(run_dir: str | Path, new: list[TaskScore]) -> Path:
    """Add `new` to RUN_DIR/lm_eval_scores.json (an entry of the same model, weights, task, limit, shots, chat
    template and system instruction is replaced), writing the file whole. A damaged file is replaced by its usable
    entries and the new ones."""
    stored = read_task_scores(run_dir)
    kept = [e for e in stored.entries if not any(e.same_key(n) for n in new)]
    write_json_atomic(stored.path, {"hone_lm_eval_scores": _FORMAT, "entries": [e.as_dict() for e in kept + new]})
    return stored.path


def finite_or_none(value: Any) -> float | None:
    """A metric value as stored: a finite float, else None (lm-eval's "N/A", NaN, a value of another kind)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None

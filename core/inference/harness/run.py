"""A run's base model and its fine-tune scored on lm-evaluation-harness tasks, the scores stored in the run folder.

One copy of the base weights serves both (`hone eval`'s `ChatModels`: the run's adapter on a peft model): lm-eval's
`simple_evaluate` runs the selected tasks once with the adapter switched off, for the base, then once with it on,
with the same seeds, limit, shots and prompts (raw text, or through the run's chat template: see prompts.py). Each
model's entries go into RUN_DIR/lm_eval_scores.json as soon as it is scored, so a stop during the fine-tune keeps the
base's.

    score_tasks(run_dir, config, models, selection, limit=, num_fewshot=, chat_template=, system_instruction=)
        -> TaskTable

Light to import: lm-eval and torch load when `score_tasks` runs.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError
from hone.core.inference.harness.prompts import check_prompt_settings, require_chat_template, text_tokenizer
from hone.core.inference.harness.store import TaskScore, finite_or_none, store_task_scores
from hone.core.inference.harness.tasks import TaskSelection, require_lm_eval
from hone.core.inference.score_store import file_sha256, now

# Requests per forward pass. lm-eval's own default is 1, which leaves a GPU mostly idle; 8 padded rows keep it busier
# while the padding and a generation batch's KV cache stay small. --batch-size changes it.
TASK_BATCH_SIZE = 8
# The adapter's weights file, as peft saves it (older peft: a pickle, read by peft, hashed here all the same).
_ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_SIDES = (("base", "the base model"), ("tuned", "the fine-tune"))


@dataclass
class TaskTable:
    """The result of one `score_tasks`: each model's entries, in the order of the tasks given.

    Attributes:
        base, tuned: the entries of the base model and of the fine-tune.
        path: the file they were stored in.
        lm_eval: lm-eval's version.
        notes: sentences to show (a task lm-eval reported nothing for).
        chat_template: the prompts went through the run's chat template.
        system_instruction: the system message before each prompt, or None.
    """

    base: list[TaskScore]
    tuned: list[TaskScore]
    path: Path
    lm_eval: str
    notes: list[str] = field(default_factory=list)
    chat_template: bool = False
    system_instruction: str | None = None

    def entries(self) -> list[TaskScore]:
        return [*self.base, *self.tuned]


def adapter_weights(run_dir: Path) -> str:
    """What the run's adapter is known by in stored entries: "adapter:<sha256 of its weights file>"."""
    for name in _ADAPTER_FILES:
        path = run_dir / "adapter" / name
        if path.is_file():
            return f"adapter:{file_sha256(path)}"
    raise HoneError(
        f"run {run_dir.name} has no adapter weights in {run_dir / 'adapter'}",
        "finish or resume the run first (`hone train --resume RUN`)",
    )


def score_tasks(
    run_dir: str | Path,
    config,
    models,
    selection: TaskSelection,
    *,
    limit: int | None = None,
    num_fewshot: int | None = None,
    chat_template: bool = False,
    system_instruction: str | None = None,
    batch_size: int = TASK_BATCH_SIZE,
    progress=None,
) -> TaskTable:
    """Score the base and the fine-tune on the selected tasks and store the entries in RUN_DIR/lm_eval_scores.json.

    Args:
        run_dir: the run folder.
        config: its RunConfig (the base model's name is what the base's entries are known by).
        models: `ChatModels` of the run with its adapter (`ChatModels.for_run(run_dir)`).
        selection: the tasks, from `select_tasks`.
        limit: rows per task; None = every row.
        num_fewshot: examples per prompt; None = each task's own.
        chat_template: render each prompt with the tokenizer's chat template, solved examples as earlier turns
            (lm-eval's apply_chat_template and fewshot_as_multiturn); False: lm-eval's raw text.
        system_instruction: with `chat_template`, a system message before each prompt.
        batch_size: requests per forward pass.
        progress: called with (label, requests done, requests in all).

    Raises:
        HoneError: lm-eval is missing; `models` has no adapter; the run's adapter file is gone; an empty system
            instruction, or one without `chat_template`; `chat_template` on a tokenizer without one, or a system
            instruction its template refuses.
    """
    version = require_lm_eval()
    if not models.has_adapter:
        raise HoneError("there is no fine-tune to score beside the base", "score a run that has an adapter")
    run_dir = Path(run_dir)
    check_prompt_settings(chat_template, system_instruction)
    if chat_template:
        require_chat_template(models.tokenizer, run_dir.name, system_instruction)
    weights = {"base": f"base:{config.model.name_or_path}", "tuned": adapter_weights(run_dir)}
    table = TaskTable(
        base=[],
        tuned=[],
        path=run_dir,
        lm_eval=version,
        chat_template=chat_template,
        system_instruction=system_instruction,
    )
    for side, who in _SIDES:
        results = _evaluate(
            models,
            selection,
            who,
            progress,
            base=side == "base",
            limit=limit,
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            chat_template=chat_template,
            system_instruction=system_instruction,
        )
        entries, missing = task_entries(
            results,
            selection.names,
            side,
            weights[side],
            limit,
            version,
            chat_template=chat_template,
            system_instruction=system_instruction,
        )
        table.notes += [f"lm-eval reported nothing for {name} on {who}" for name in missing]
        table.path = store_task_scores(run_dir, entries)  # at once: a stop later keeps what was scored
        (table.base if side == "base" else table.tuned).extend(entries)
    return table


def _evaluate(
    models,
    selection,
    who,
    progress,
    *,
    base: bool,
    limit: int | None,
    num_fewshot: int | None,
    batch_size: int,
    chat_template: bool,
    system_instruction: str | None,
) -> dict[str, Any]:
    """One model's `simple_evaluate` (the base's: the adapter switched off), its errors in words."""
    import lm_eval

    from hone.core.inference.harness.model import HoneLM

    lm = HoneLM(models.model, text_tokenizer(models.tokenizer), batch_size=batch_size, who=who, progress=progress)
    try:
        with models.model.disable_adapter() if base else nullcontext():
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=selection.objects,
                task_manager=selection.manager,
                limit=limit,
                num_fewshot=num_fewshot,
                log_samples=False,
                system_instruction=system_instruction,
                apply_chat_template=chat_template,
                # As lm-eval's own command line does with the template: each solved example a user turn and an
                # assistant turn, not all pasted into one user message (with no examples the two are the same).
                # Without the template lm-eval's text is the same either way; its CLI refuses the pair, so False.
                fewshot_as_multiturn=chat_template,
            )
    except LookupError as e:  # nltk's data (IFEval's sentence splitter): lm-eval downloads it on import, if it can
        if "nltk" not in str(e).lower():
            raise
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # nltk may colour the resource's name
        resource = re.search(r"Resource '?([\w./-]+)'? not found", text)
        name = resource.group(1) if resource else "punkt_tab"
        raise HoneError(
            f"an lm-eval task needs nltk's {name} data, which is not on this machine",
            f"download it once where the network can be reached: python -m nltk.downloader {name}",
        ) from None
    if results is None:  # only another process than the first of several gets None; this is one process
        raise HoneError("lm-eval returned no results", "run `hone eval` in a single process, not under torchrun")
    return results


def task_entries(
    results: dict[str, Any],
    names: list[str],
    model: str,
    weights: str,
    limit: int | None,
    version: str,
    *,
    chat_template: bool = False,
    system_instruction: str | None = None,
) -> tuple[list[TaskScore], list[str]]:
    """The entries of `names` in `simple_evaluate`'s results, and the names it reported nothing for.

    Each entry holds lm-eval's "metric,filter" values, their standard errors where it gives a number, the rows it
    scored (`sample_len`), the shots (`n-shot`), the task's version and how the prompts were given.
    """
    reported = results.get("results", {})
    shots = results.get("n-shot", {})
    versions = results.get("versions", {})
    scored = now()
    entries, missing = [], []
    for name in names:
        row = reported.get(name)
        if not isinstance(row, dict):
            missing.append(name)
            continue
        metrics: dict[str, float | None] = {}
        stderr: dict[str, float] = {}
        for key, value in row.items():
            if "," not in key:  # name, alias, sample_len, sample_count: not metrics
                continue
            metric, _, where = key.partition(",")
            if metric.endswith("_stderr"):
                error = finite_or_none(value)
                if error is not None:
                    stderr[f"{metric[: -len('_stderr')]},{where}"] = error
            else:
                metrics[key] = finite_or_none(value)
        shot = shots.get(name)
        entries.append(
            TaskScore(
                model=model,
                weights=weights,
                task=name,
                limit=limit,
                num_fewshot=shot if isinstance(shot, int) and not isinstance(shot, bool) else None,
                samples=int(row.get("sample_len") or 0),
                metrics=metrics,
                stderr=stderr,
                task_version=str(versions.get(name, "")),
                lm_eval=version,
                scored=scored,
                chat_template=chat_template,
                system_instruction=system_instruction,
            )
        )
    return entries, missing

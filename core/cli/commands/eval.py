"""`hone eval RUN_DIR [--data FILE] [--rows N] [--out FILE]`: held-out prompts answered by the base model and the
fine-tune, scored against their references (hone.core.inference.evaluate).

`hone eval RUN_DIR --checkpoints all|best|STEP[,STEP...] [--by METRIC] [--json OUT]`: the base and each of the run's
saved checkpoints scored on the same rows, the scores stored in RUN_DIR/scores.json and reused
(hone.core.inference.checkpoint_scoring).

`hone eval RUN_DIR --task T[,T...] [--task-dir FOLDER] [--limit N] [--num-fewshot K] [--chat-template
[--system-instruction TEXT]] [--batch-size B] [--json OUT]`: the base and the fine-tune scored on lm-evaluation-harness
tasks (GSM8K, MMLU, HellaSwag, ARC, IFEval, or tasks of your own in lm-eval's YAML format), the scores stored in
RUN_DIR/lm_eval_scores.json (hone.core.inference.harness).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from hone.core.config import PREFERENCE_METHODS
from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    from hone.core.api import DEFAULT_METRIC, DEFAULT_ROWS, METRICS

    p = sub.add_parser(
        "eval",
        help="score the base model and the fine-tune on held-out prompts",
        description="Answer held-out prompts with the run's base model and with its fine-tune "
        "(greedy, up to the longest reference and a few tokens more) and score each answer against "
        "the row's reference reply: exact match and word F1 (the overlap of the answer's words with "
        'the reference\'s). Rows: JSONL with a final assistant turn ({"messages": [...]}) or '
        '{"prompt", "completion"}; rows without a reference are left out.\n\n'
        "With --checkpoints the base and each saved checkpoint of the run are scored on the same rows: held-out "
        "loss and perplexity, exact and normalized match, word F1, contains, and JSON validity where the references "
        "are JSON. The scores are stored in RUN_DIR/scores.json: a checkpoint already scored on the same rows of the "
        "same file is not scored again.\n\n"
        "With --task the base and the fine-tune are scored on lm-evaluation-harness tasks instead (the eval extra: "
        'pip install "hone-studio[eval]"): gsm8k, mmlu, hellaswag, arc_challenge, arc_easy, ifeval or any other of '
        "lm-eval's tasks, groups and tags, or your own in lm-eval's YAML format (--task-dir, or a .yaml path). Task "
        "data is downloaded from the Hugging Face Hub on first use and read from its cache after. Prompts are raw "
        "text, as lm-eval gives them and published leaderboards score them; --chat-template gives them through the "
        "run's chat template instead, as a chat fine-tune is used. The scores are stored in "
        "RUN_DIR/lm_eval_scores.json.\n\n"
        "exit codes: 0 done, 2 bad input (no run, no adapter, no checkpoint of that step, no rows with a reference, "
        "an unknown task, task data that cannot be read)",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder `hone train` wrote")
    p.add_argument("--data", metavar="FILE", help="the held-out rows (default: the run's first data.eval file)")
    p.add_argument(
        "--rows",
        type=int,
        metavar="N",
        help=f"score the first N rows with a reference (default {DEFAULT_ROWS}; 0 = all)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="also write one JSONL row per prompt: question, reference, both answers and their scores",
    )
    p.add_argument(
        "--checkpoints",
        metavar="WHICH",
        help="score the run's saved checkpoints and the base: all, best (all, showing the best), or STEP[,STEP...]",
    )
    p.add_argument(
        "--by",
        metavar="METRIC",
        help=f"what best means with --checkpoints: {', '.join(METRICS)} (default: {DEFAULT_METRIC}); best is the "
        "lowest loss or perplexity, the highest of the others",
    )
    p.add_argument("--json", metavar="OUT", help="with --checkpoints or --task: also write the scores as JSON to OUT")
    _add_task_options(p)
    return p


def _add_task_options(p: argparse.ArgumentParser) -> None:
    from hone.core.api import TASK_BATCH_SIZE

    p.add_argument(
        "--task",
        metavar="T[,T...]",
        help="score the base and the fine-tune on lm-evaluation-harness tasks, groups or tags (gsm8k, mmlu, "
        "hellaswag, arc_challenge, ifeval, ...) or task YAML files; `lm-eval ls tasks` lists them",
    )
    p.add_argument(
        "--task-dir",
        metavar="FOLDER",
        help="with --task: a folder of your own tasks in lm-eval's YAML format, found by the names they give",
    )
    p.add_argument(
        "--limit", type=int, metavar="N", help="with --task: score the first N rows of each task (default: all)"
    )
    p.add_argument(
        "--num-fewshot",
        type=int,
        metavar="K",
        help="with --task: K solved examples before each question (default: each task's own)",
    )
    p.add_argument(
        "--chat-template",
        action="store_true",
        default=None,  # None, not False: "goes with --task" looks for options given
        help="with --task: give each prompt through the run's chat template, each solved example as an earlier turn "
        "(lm-eval's --apply_chat_template --fewshot_as_multiturn). Turn it on for a chat or instruction fine-tune, "
        "which answers raw text worse than it answers a chat; leave it off (the default, lm-eval's) to compare with "
        "published leaderboards and other runs scored on raw text. The base gets the same prompts",
    )
    p.add_argument(
        "--system-instruction",
        metavar="TEXT",
        help="with --chat-template: a system message before each prompt (stored with the scores)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help=f"with --task: requests per forward pass (default {TASK_BATCH_SIZE}; fewer needs less memory)",
    )


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from hone.core.api import BASE, TUNED, compare, held_out_file, read_prompts, with_references
    from hone.core.cli.commands.chat import load_chat_models, open_chat_run
    from hone.core.cli.console import Phase

    if args.task is not None:
        return _score_tasks(args)
    for option in ("task_dir", "limit", "num_fewshot", "batch_size", "chat_template", "system_instruction"):
        if getattr(args, option) is not None:
            flag = "--" + option.replace("_", "-")
            raise HoneError(f"{flag} goes with --task", f"add --task NAME (e.g. gsm8k), or leave {flag} out")
    if args.rows is None:
        from hone.core.api import DEFAULT_ROWS

        args.rows = DEFAULT_ROWS
    if args.rows < 0:
        raise HoneError(f"--rows is {args.rows}", "give a number of rows, or 0 for all")
    if args.checkpoints is not None:
        return _score_checkpoints(args)
    if args.by is not None:
        raise HoneError("--by goes with --checkpoints", "add --checkpoints all, or leave --by out")
    if args.json is not None:
        raise HoneError("--json goes with --checkpoints or --task", "add --checkpoints all, or leave --json out")
    run_dir, config = open_chat_run(args.run_dir, base=False)
    if config.train.method in PREFERENCE_METHODS:
        return _rank_pairs(args, run_dir, config)
    data = held_out_file(config, args.data)
    prompts, skipped = read_prompts(data)
    prompts = with_references(prompts, args.rows or None)
    console = Console(stderr=True)
    for line in skipped:
        console.print(f"hone: skipped {line}", highlight=False, markup=False)
    models = load_chat_models(run_dir, config, False, console)
    with Phase(
        console,
        f"answering {len(prompts)} held-out prompts with the base and the fine-tune",
        total=len(prompts),
        unit="prompts",
    ) as phase:
        result = compare(models, prompts, progress=lambda done, _total: phase.update(done))
    table = Table(title=f"{run_dir.name} on {len(result.answered)} rows of {data.name}")
    table.add_column("model")
    table.add_column("exact match", justify="right")
    table.add_column("word F1", justify="right")
    for name, side in (("base", BASE), ("fine-tuned", TUNED)):
        table.add_row(name, f"{result.exact_matches(side)}/{len(result.answered)}", f"{result.mean_f1(side):.2f}")
    Console().print(table)
    if args.out:
        with Path(args.out).expanduser().open("w", encoding="utf-8") as f:
            for a in result.answered:
                f.write(
                    json.dumps(
                        {
                            "row": a.row,
                            "question": a.question,
                            "reference": a.reference,
                            "base": a.base,
                            "tuned": a.tuned,
                            "base_exact": a.exact(BASE),
                            "tuned_exact": a.exact(TUNED),
                            "base_f1": round(a.f1(BASE), 4),
                            "tuned_f1": round(a.f1(TUNED), 4),
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
        console.print(f"wrote {len(result.answered)} rows to {args.out}", highlight=False)
    return 0


def _rank_pairs(args, run_dir: Path, config) -> int:
    """A preference run: how often the base and the fine-tune rank each held-out pair's chosen answer first."""
    from rich.console import Console
    from rich.table import Table

    from hone.core.api import held_out_pairs, score_pairs
    from hone.core.cli.commands.chat import load_chat_models
    from hone.core.cli.console import Phase

    if args.out:
        raise HoneError("--out writes answers to prompts; a preference run scores pairs", "leave --out out")
    console = Console(stderr=True)
    models = load_chat_models(run_dir, config, False, console)
    pairs = held_out_pairs(config, models.tokenizer, args.data)
    count = min(args.rows, len(pairs)) if args.rows else len(pairs)
    with Phase(
        console, f"ranking {count} held-out pairs with the base and the fine-tune", total=count, unit="pairs"
    ) as phase:
        scores = score_pairs(models, pairs, limit=count, progress=lambda done, _total: phase.update(done))
    table = Table(title=f"{run_dir.name}: the chosen answer ranked first, on {scores.pairs} held-out pairs")
    table.add_column("model")
    table.add_column("preference accuracy", justify="right")
    table.add_column("margin per token", justify="right")
    for name, tuned, margin in (("base", False, scores.base_margin), ("fine-tuned", True, scores.tuned_margin)):
        right = scores.tuned_right if tuned else scores.base_right
        table.add_row(name, f"{right}/{scores.pairs} ({scores.accuracy(tuned):.0%})", f"{margin:+.3f}")
    out = Console()
    out.print(table)
    out.print(
        f"reward accuracy (the fine-tune gained more over the base on the chosen answer): "
        f"{scores.reward_right}/{scores.pairs}",
        highlight=False,
    )
    return 0


def _score_checkpoints(args) -> int:
    """--checkpoints: the base and the chosen checkpoints scored (or their stored scores reused), one table."""
    import contextlib

    from rich.console import Console

    from hone.core.api import (
        DEFAULT_METRIC,
        check_metric,
        held_out_file,
        score_checkpoints,
        select_checkpoints,
    )
    from hone.core.cli.commands.chat import open_chat_run
    from hone.core.cli.console import Phase, convert_gguf_once

    by = check_metric(args.by or DEFAULT_METRIC)
    if args.out:
        raise HoneError(
            "--out writes the base's and the final adapter's answers; --checkpoints stores scores in the run folder",
            "leave --out out, or --json OUT for the table",
        )
    run_dir, config = open_chat_run(args.run_dir, base=True)  # checkpoints, not the final adapter
    if config.train.method in PREFERENCE_METHODS:
        raise HoneError(
            f"--checkpoints scores answers to held-out prompts; run {run_dir.name} is a {config.train.method} run",
            f"`hone eval {run_dir}` (without --checkpoints) ranks its held-out pairs",
        )
    checkpoints, notes = select_checkpoints(run_dir, args.checkpoints)
    data = held_out_file(config, args.data)
    console = Console(stderr=True)
    for note in notes:
        console.print(f"hone: {note}", highlight=False, markup=False, soft_wrap=True)

    @contextlib.contextmanager
    def loading():
        convert_gguf_once(config.model, console)
        with Phase(console, f"loading the base model with the run's LoRA ({config.model.name_or_path})"):
            yield

    with Phases(console) as phases:
        table = score_checkpoints(
            run_dir, config, checkpoints, data, args.rows or None, progress=phases.update, loading=loading
        )
    for line in [*table.skipped, *table.notes]:
        console.print(f"hone: {line}", highlight=False, markup=False, soft_wrap=True)
    if table.reused:
        console.print(
            f"reused the stored scores of {', '.join(table.reused)} (the same weights on the same rows, in "
            f"{run_dir / 'scores.json'}): not scored again",
            highlight=False,
            soft_wrap=True,
        )
    best = table.best(by)
    shown = table.checkpoints if args.checkpoints.strip().lower() != "best" else [e for e in [best] if e]
    print_table(run_dir, table, shown, best, by)
    if args.json:
        _write_json(Path(args.json).expanduser(), run_dir, table, shown, best, by)
        console.print(f"wrote the table to {args.json}", highlight=False, soft_wrap=True)
    return 0


def _score_tasks(args) -> int:
    """--task: the base and the fine-tune on lm-evaluation-harness tasks, one table, stored in the run folder."""
    from rich.console import Console

    from hone.core.api import (
        TASK_BATCH_SIZE,
        check_task_prompts,
        require_lm_eval,
        score_tasks,
        select_tasks,
        split_specs,
    )
    from hone.core.cli.commands.chat import load_chat_models, open_chat_run
    from hone.core.cli.console import Phase

    _check_task_options(args)
    specs = split_specs(args.task)
    require_lm_eval()  # before the run or the tasks are looked at: without it nothing else can happen
    run_dir, config = open_chat_run(args.run_dir, base=False)
    chat_template = bool(args.chat_template)
    # The run's tokenizer alone (no weights): a run without a chat template is said before the tasks' data is read.
    check_task_prompts(run_dir, config, chat_template=chat_template, system_instruction=args.system_instruction)
    console = Console(stderr=True)
    with Phase(console, f"reading lm-eval tasks {', '.join(specs)} and their data"):
        selection = select_tasks(specs, args.task_dir)
    models = load_chat_models(run_dir, config, False, console)
    with Phases(console, text=lambda label, _total: label, unit="requests") as phases:
        table = score_tasks(
            run_dir,
            config,
            models,
            selection,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            chat_template=chat_template,
            system_instruction=args.system_instruction,
            batch_size=args.batch_size or TASK_BATCH_SIZE,
            progress=phases.update,
        )
    for note in table.notes:
        console.print(f"hone: {note}", highlight=False, markup=False, soft_wrap=True)
    print_task_table(run_dir, table, args.limit)
    console.print(f"stored in {table.path}", highlight=False, soft_wrap=True)
    if args.json:
        document = {
            "run": str(run_dir.resolve()),
            "lm_eval": table.lm_eval,
            "tasks": selection.names,
            "limit": args.limit,
            "num_fewshot": args.num_fewshot,
            "chat_template": table.chat_template,
            "system_instruction": table.system_instruction,
            "entries": [e.as_dict() for e in table.entries()],
        }
        write_json_file(Path(args.json).expanduser(), document)
        console.print(f"wrote the scores to {args.json}", highlight=False, soft_wrap=True)
    return 0


def _check_task_options(args) -> None:
    """--task's own options in range, and none of the held-out rows' or checkpoints' options beside it."""
    for option, value in (("--checkpoints", args.checkpoints), ("--data", args.data), ("--rows", args.rows),
                          ("--out", args.out), ("--by", args.by)):  # fmt: skip
        if value is not None:
            raise HoneError(
                f"{option} goes with the held-out rows' scores, not with --task (lm-eval tasks)",
                f"run them as two commands: `hone eval RUN --task ...` and `hone eval RUN {option} ...`",
            )
    for option, value, least in (("--limit", args.limit, 1), ("--num-fewshot", args.num_fewshot, 0),
                                 ("--batch-size", args.batch_size, 1)):  # fmt: skip
        if value is not None and value < least:
            raise HoneError(f"{option} is {value}", f"give a whole number of at least {least}")


def print_task_table(run_dir: Path, table, limit: int | None) -> None:
    """One row per task and metric: the base's value, the fine-tune's, and the change."""
    from rich.console import Console
    from rich.table import Table

    rows = "every row" if limit is None else f"at most {limit} rows"
    prompts = "through the chat template" if table.chat_template else "raw text"
    out = Table(title=f"{run_dir.name} on lm-eval tasks ({rows} per task, {prompts}, lm-eval {table.lm_eval})")
    for heading in ("task", "rows", "shots", "metric"):
        out.add_column(heading)
    for heading in ("base", "fine-tuned", "change"):
        out.add_column(heading, justify="right")
    tuned = {e.task: e for e in table.tuned}
    for base in table.base:
        other = tuned.get(base.task)
        for metric, value in base.metrics.items():
            after = other.metrics.get(metric) if other else None
            change = "" if value is None or after is None else f"{after - value:+.4f}"
            cells = (_value(base, metric), _value(other, metric) if other else "n/a", change)
            out.add_row(base.task, str(base.samples), str(base.num_fewshot), metric, *cells)
    console = Console()
    console.print(out)
    if table.system_instruction is not None:
        console.print(f"system instruction: {table.system_instruction}", highlight=False, markup=False, soft_wrap=True)


def _value(entry, metric: str) -> str:
    value = entry.metrics.get(metric)
    if value is None:
        return "n/a"
    error = entry.stderr.get(metric)
    return f"{value:.4f}" + (f" ± {error:.4f}" if error is not None else "")


_COLUMNS = (  # metric, heading, format
    ("loss", "loss", "{:.4f}"),
    ("perplexity", "perplexity", "{:.3g}"),
    ("exact", "exact", "{:.0%}"),
    ("normalized", "normalized", "{:.0%}"),
    ("f1", "word F1", "{:.2f}"),
    ("contains", "contains", "{:.0%}"),
    ("json_valid", "JSON valid", "{:.0%}"),
)


def print_table(run_dir: Path, table, shown: list, best, by: str) -> None:
    from rich.console import Console
    from rich.table import Table

    entries = [e for e in [table.base, *shown] if e is not None]
    columns = [
        c for c in _COLUMNS if c[0] != "json_valid" or any(e.metrics.get("json_valid") is not None for e in entries)
    ]
    out = Table(title=f"{run_dir.name} on {table.data.rows} rows of {Path(table.data.path).name}")
    out.add_column("model")
    for _, heading, _ in columns:
        out.add_column(heading, justify="right")
    for entry in entries:
        mark = " *" if best is not None and entry is best else ""
        cells = [
            "n/a" if entry.metrics.get(name) is None else fmt.format(entry.metrics[name]) for name, _, fmt in columns
        ]
        out.add_row(entry.label + mark, *cells)
    console = Console()
    console.print(out)
    if best is not None:
        console.print(f"* best by {by}: checkpoint step {best.checkpoint}", highlight=False)


def _write_json(path: Path, run_dir: Path, table, shown: list, best, by: str) -> None:
    entries = [e for e in [table.base, *shown] if e is not None]
    document = {
        "run": str(run_dir.resolve()),
        "data": table.data.as_dict(),
        "by": by,
        "best": None if best is None else best.checkpoint,
        "reused": table.reused,
        "entries": [e.as_dict() for e in entries],
    }
    write_json_file(path, document)


def write_json_file(path: Path, document: dict) -> None:
    """--json OUT: `document` written beside OUT and renamed over it, so OUT is whole or as it was."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise HoneError(
            f"cannot write --json {path}: {e.strerror or e}",
            "choose a file in a folder you can write to (the scores are stored in the run folder all the same)",
        ) from None


class Phases:
    """One `Phase` line per model scored: `update(label, done, total)` opens a new line when the label changes.
    `text(label, total)` and `unit` say what the line shows (default: "scoring LABEL on TOTAL rows")."""

    def __init__(self, console, text=None, unit: str = "rows"):
        self.console = console
        self.text = text or (lambda label, total: f"scoring {label} on {total} rows")
        self.unit = unit
        self.label: str | None = None
        self.phase = None

    def __enter__(self) -> Phases:
        return self

    def update(self, label: str, done: int, total: int) -> None:
        from hone.core.cli.console import Phase

        if label != self.label:
            self._close(None)
            self.label = label
            self.phase = Phase(self.console, self.text(label, total), total=total, unit=self.unit)
            self.phase.__enter__()
        self.phase.update(done)

    def _close(self, exc_type) -> None:
        if self.phase is not None:
            self.phase.__exit__(exc_type, None, None)
            self.phase = None

    def __exit__(self, exc_type, *exc) -> None:
        self._close(exc_type)

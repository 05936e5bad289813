"""`hone eval RUN_DIR [--data FILE] [--rows N] [--out FILE]`: held-out prompts answered by the base model and the
fine-tune, scored against their references (hone.core.inference.evaluate)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hone.core.config import PREFERENCE_METHODS
from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="score the base model and the fine-tune on held-out prompts",
        description="Answer held-out prompts with the run's base model and with its fine-tune "
        "(greedy, up to the longest reference and a few tokens more) and score each answer against "
        "the row's reference reply: exact match and word F1 (the overlap of the answer's words with "
        'the reference\'s). Rows: JSONL with a final assistant turn ({"messages": [...]}) or '
        '{"prompt", "completion"}; rows without a reference are left out.\n\n'
        "exit codes: 0 done, 2 bad input (no run, no adapter, no rows with a reference)",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder `hone train` wrote")
    p.add_argument("--data", metavar="FILE", help="the held-out rows (default: the run's first data.eval file)")
    p.add_argument(
        "--rows",
        type=int,
        default=20,
        metavar="N",
        help="score the first N rows with a reference (default 20; 0 = all)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="also write one JSONL row per prompt: question, reference, both answers and their scores",
    )
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from hone.core.api import BASE, TUNED, compare, held_out_file, read_prompts, with_references
    from hone.core.cli.commands.chat import load_chat_models, open_chat_run
    from hone.core.cli.console import Phase

    if args.rows < 0:
        raise HoneError(f"--rows is {args.rows}", "give a number of rows, or 0 for all")
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

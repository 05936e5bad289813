"""`hone demo`: the embedded default job, end to end on the bundled model and data."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="fine-tune the bundled SmolLM2-135M on a bundled task; show the score before and after",
        description="Fine-tunes SmolLM2-135M-Instruct (bundled) to answer "
        "with one exact line of JSON, and prints held-out exact match before and after.",
    )
    p.add_argument("--runs-dir", default=None, help="where the run folder goes (default: ./runs)")
    p.add_argument("--steps", type=int, default=None, help="train this many steps instead of one epoch")
    p.add_argument("--eval-rows", type=int, default=None, help="score on the first N held-out rows only")
    p.add_argument(
        "--model",
        default=None,
        help="try the task on another model (an id, folder or .gguf) instead of the bundled SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--vision",
        action="store_true",
        help="the vision demo instead: SmolLM2 with a vision encoder "
        "learns to name the color and shape in pictures, text-only rows in the same batches",
    )
    return p


def run(args) -> int:
    from rich.table import Table

    from hone.core.api import check_model, demo_config, run_demo
    from hone.core.cli.console import EventPrinter, Phase, convert_gguf_once

    if args.vision:
        return run_vision(args)
    config = demo_config(args.runs_dir, args.steps, args.model)
    # Before torch loads or anything is written: a wrong --model is one line, exit 2.
    check_model(config.model, given_as="--model")
    with EventPrinter() as printer:
        console = printer.console
        convert_gguf_once(config.model, console)
        result = _print_events(
            printer,
            run_demo(
                config,
                eval_rows=args.eval_rows,
                on_stage=lambda text: console.print(f"[bold]{text}"),
                phase=lambda text, total: Phase(console, text, total, unit="rows scored"),
            ),
        )
    if result is None:
        return 1
    table = Table(title="held-out exact match (answer must equal the reference JSON line)")
    table.add_column("model")
    table.add_column("exact", justify="right")
    table.add_row(
        config.model.name_or_path, f"{result.before.correct}/{result.before.total} ({100 * result.before.rate:.0f}%)"
    )
    table.add_row("+ Hone LoRA", f"{result.after.correct}/{result.after.total} ({100 * result.after.rate:.0f}%)")
    console.print(table)
    expected, got = result.after.examples[0]
    console.print(f"example: expected {expected}\n         got      {got.strip()}")
    console.print(f"adapter: {result.adapter_dir}")
    return 0


def run_vision(args) -> int:
    from rich.table import Table

    from hone.core.api import CHANCE, run_vision_demo, vision_demo_config
    from hone.core.cli.console import EventPrinter

    with EventPrinter() as printer:
        console = printer.console
        console.print("[bold]building the demo model (first run only)")
        config = vision_demo_config(args.runs_dir, args.steps)
        result = _print_events(
            printer,
            run_vision_demo(config, eval_rows=args.eval_rows, on_stage=lambda text: console.print(f"[bold]{text}")),
        )
    if result is None:
        return 1
    table = Table(
        title="held-out answers (image questions: the reply starts with the right word; text: it names the right city)"
    )
    table.add_column("model")
    for title in ("color", "shape", "text-only"):
        table.add_column(title, justify="right")
    for name, s in (
        ("SmolLM2-135M + random vision encoder", result.before),
        ("+ Hone (LoRA + projector)", result.after),
    ):
        table.add_row(
            name,
            *(
                f"{s.counts.get(k, (0, 0))[0]}/{s.counts.get(k, (0, 0))[1]} ({100 * s.rate(k):.0f}%)"
                for k in ("color", "shape", "text")
            ),
        )
    table.add_row("chance", f"{100 * CHANCE['color']:.0f}%", f"{100 * CHANCE['shape']:.0f}%", "")
    console.print(table)
    for kind, expected, got in result.after.examples:
        console.print(f"{kind:>5}: expected {expected!r:12} got {got!r}")
    console.print(f"adapter: {result.adapter_dir}")
    return 0


def _print_events(printer, demo):
    """Print each event a demo generator yields; return the generator's result."""
    try:
        while True:
            printer.handle(next(demo))
    except StopIteration as done:
        return done.value

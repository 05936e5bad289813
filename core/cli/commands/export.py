"""`hone export RUN_DIR --format FORMAT[:TYPE] [--out DIR] [--force] [--checkpoint best|STEP [--by METRIC]]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from hone.core.api import FORMAT_TYPES, SUPPORTED_FORMATS
from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    from hone.core.api import DEFAULT_METRIC, METRICS

    formats = "\n".join(
        f"  {name:<10} {text}" + (f"\n{'':13}types: {', '.join(FORMAT_TYPES[name])}" if FORMAT_TYPES[name] else "")
        for name, text in SUPPORTED_FORMATS.items()
    )
    p = sub.add_parser(
        "export",
        help="export a run: adapter, merged model, GGUF, GGUF LoRA or Ollama",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a trained run and prove the result by reading it back (logits, "
        "tensors, tokenizer, template).\n\nformats:\n" + formats,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (holds config.toml and adapter/)")
    p.add_argument(
        "--format",
        "-f",
        dest="fmt",
        default="adapter",
        metavar="FORMAT[:TYPE]",
        help="adapter | merged[:bf16|f16] | gguf[:TYPE] | gguf-lora[:f32|f16|bf16] | ollama[:TYPE] "
        "(default: adapter; GGUF types default to q8_0)",
    )
    p.add_argument(
        "--out", "-o", default=None, metavar="DIR", help="output folder (default: RUN_DIR/exports/<format>[-type])"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an output folder that an earlier export wrote (never any other folder)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="best|STEP",
        help="export a saved checkpoint's adapter instead of the final one: STEP, or best by the scores "
        "`hone eval RUN --checkpoints all` stored (default folder: RUN_DIR/exports/<format>-step-N)",
    )
    p.add_argument(
        "--by",
        metavar="METRIC",
        help=f"what --checkpoint best means: {', '.join(METRICS)} (default: {DEFAULT_METRIC}); best is the lowest "
        "loss or perplexity, the highest of the others",
    )
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hone.core.api import check_model, open_run, output_folder, parse_format
    from hone.core.cli.console import convert_gguf_once

    # A wrong format, a folder that is no run (or has no adapter yet), an output folder in the way or a base model
    # that is gone: one line, exit 2, before torch loads and before anything is written.
    spec = parse_format(args.fmt)
    console = Console(stderr=True)
    if args.checkpoint is not None:
        checkpoint, scores, config = _pick_checkpoint(args, console)
    else:
        if args.by is not None:
            raise HoneError("--by goes with --checkpoint best", "add --checkpoint best, or leave --by out")
        source = open_run(args.run_dir)
        output_folder(source, spec, args.out, args.force)
        checkpoint, scores, config = None, None, source.config
    check_model(config.model, given_as=f"model.name_or_path in {Path(args.run_dir) / 'config.toml'}")
    from hone.core.api import export_run

    if checkpoint is None:
        training = source.training_note()  # a resume training in the folder: say which adapter this exports, up front
        if training:
            console.print(f"[yellow]note:[/yellow] {training}", soft_wrap=True, highlight=False)
    convert_gguf_once(config.model, console)  # a run trained elsewhere: the base's first load here
    with Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=1.0)
        result = export_run(
            args.run_dir,
            args.fmt,
            args.out,
            force=args.force,
            progress=lambda stage, done: bar.update(task, description=stage, completed=done),
            checkpoint=checkpoint,
            scores=scores,
        )
    console.print(f"[bold]{result.format} export checks[/bold]")
    width = max(map(len, result.checks), default=0)
    for name, value in result.checks.items():
        text = f"{value:.3g}" if isinstance(value, float) else str(value)
        console.print(
            f"  {name:<{width}}  " + (f"[red]{text}[/red]" if text.startswith("FAILED") else text),
            soft_wrap=True,
            highlight=False,
        )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}", soft_wrap=True, highlight=False)
    console.print("[bold]files[/bold]")
    for path in result.files:
        console.print(f"  {path}", soft_wrap=True, highlight=False)
    if not result.passed:
        for failure in result.failures:
            console.print(f"[red]check failed:[/red] {failure}", soft_wrap=True)
        console.print(f"[red]export written to {result.path} but it did not pass its checks[/red]", soft_wrap=True)
        return 1
    console.print(f"[green]exported[/green] {result.format} to {result.path} (all checks passed)", soft_wrap=True)
    console.print(
        f"share it on the Hugging Face Hub with `hone push {result.path} OWNER/NAME`",
        style="dim",
        soft_wrap=True,
        highlight=False,
    )
    return 0


def _pick_checkpoint(args, console):
    """--checkpoint: (step, its stored scores as a dict or None, the run's config), checked before torch loads: the
    run folder, the step among its checkpoints (best: the stored scores' pick), the output folder."""
    from hone.core.api import (
        CONFIG_FILE,
        DEFAULT_METRIC,
        best_stored,
        check_metric,
        checkpoint_output,
        checkpoint_weights,
        stored_for_step,
    )
    from hone.core.config import RunConfig

    run_dir = Path(args.run_dir).expanduser()
    if not run_dir.is_dir():
        raise HoneError(f"{run_dir} does not exist", "give the folder of a run (runs/<name>)")
    if not (run_dir / CONFIG_FILE).is_file():
        raise HoneError(
            f"{run_dir} is not a run folder (it has no {CONFIG_FILE})", "give the folder `hone train` wrote for the run"
        )
    config = RunConfig.load(run_dir / CONFIG_FILE)
    which = args.checkpoint.strip().lower()
    if which == "best":
        by = check_metric(args.by or DEFAULT_METRIC)
        entry = best_stored(run_dir, by)
        step = entry.checkpoint
        console.print(
            f"best checkpoint by {by}: step {step} ({by} {entry.metrics[by]:.4g} on {entry.data.describe()})",
            highlight=False,
            soft_wrap=True,
        )
    elif which.isdigit():
        if args.by is not None:
            raise HoneError("--by picks the best checkpoint", "give --checkpoint best, or leave --by out")
        step, entry = int(which), stored_for_step(run_dir, int(which))
    else:
        raise HoneError(f"--checkpoint {args.checkpoint!r} is not best or a step", "give best, or a step like 200")
    steps = checkpoint_weights(run_dir)
    if step not in steps:
        there = ", ".join(map(str, steps)) or "none"
        raise HoneError(
            f"run {run_dir.name} has no checkpoint of step {step} (its checkpoints: {there})",
            "choose one of those steps, or leave --checkpoint out for the final adapter",
        )
    checkpoint_output(run_dir, args.fmt, step, args.out, force=args.force)
    return step, (entry.as_dict() if entry is not None else None), config

"""`hone export RUN_DIR --format FORMAT[:TYPE] [--out DIR] [--force]`."""

from __future__ import annotations

import argparse

from hone.core.api import FORMAT_TYPES, SUPPORTED_FORMATS


def add_parser(sub) -> argparse.ArgumentParser:
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
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hone.core.api import check_model, open_run, output_folder, parse_format
    from hone.core.cli.console import convert_gguf_once

    # A wrong format, a folder that is no run (or has no adapter yet), an output folder in the way or a base model
    # that is gone: one line, exit 2, before torch loads and before anything is written.
    spec = parse_format(args.fmt)
    source = open_run(args.run_dir)
    output_folder(source, spec, args.out, args.force)
    check_model(source.config.model, given_as=f"model.name_or_path in {source.run_dir / 'config.toml'}")
    from hone.core.api import export_run

    console = Console(stderr=True)
    training = source.training_note()  # a resume training in the folder: say which adapter this exports, up front
    if training:
        console.print(f"[yellow]note:[/yellow] {training}", soft_wrap=True, highlight=False)
    convert_gguf_once(source.config.model, console)  # a run trained elsewhere: the base's first load here
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

"""`hone plan RUN.toml [--gpu-memory 8GiB] [--json OUT]`: the predicted peak GPU memory of the run's step, by part,
and what auto-fit would change to fit it; from the model's config alone (no weights, no GPU needed)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

NOTHING_FITS = 3


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plan",
        help="predict a run's peak GPU memory and fit it to a GPU",
        description="Predicts the peak GPU memory of one training step of RUN.toml, by part, and "
        "what auto-fit would change (memory levers, batch size) to fit the detected GPU or the "
        "memory given. Reads the model's config only. Exit 0 when it fits, 3 when nothing fits.",
    )
    p.add_argument("config", help="the run config (TOML)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.batch_tokens=4096 (repeatable)",
    )
    p.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="plan for this much GPU memory (e.g. 8GiB) instead of the detected GPU's free memory",
    )
    p.add_argument(
        "--unified",
        action="store_true",
        help="with --gpu-memory: the GPU shares system memory (DGX Spark), so offloading is never picked",
    )
    p.add_argument("--allow-qlora", action="store_true", help="auto-fit may load the base in 4-bit")
    p.add_argument("--json", metavar="OUT", help="also write the plan as JSON")
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from hone.core.api import GIB, Memory, detect_memory, estimate_host, parse_size, plan_run
    from hone.core.config import RunConfig

    config = RunConfig.load(args.config).with_overrides(args.overrides)
    if args.gpu_memory:
        memory = Memory(parse_size(args.gpu_memory), f"{args.gpu_memory} as given", unified=args.unified)
    else:
        memory = detect_memory()
    plan = plan_run(config, memory, allow_qlora=args.allow_qlora)
    console = Console()
    shape, settings = plan.shape, plan.settings
    kind = f"MoE, {shape.experts} experts, top-{shape.top_k}" if shape.experts else "dense"
    console.print(
        f"[bold]{config.model.name_or_path}[/]: {shape.layers} layers, hidden {shape.hidden}, {kind}, "
        f"vocabulary {shape.vocab:,}"
    )
    console.print(
        f"batch {settings.batch_tokens:,} tokens, LoRA r{settings.lora_rank}"
        f"{' (QLoRA)' if settings.qlora else ''}, {settings.optimizer}, checkpoints {settings.checkpoint} "
        f"(rows assumed {plan.mean_row_tokens:,.0f} tokens on average)"
    )
    table = Table(title=f"predicted peak of one step: {plan.estimate.peak_gib:.2f} GiB")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    table.add_column("what")
    for part in plan.estimate.parts:
        table.add_row(part.name, f"{part.bytes / GIB:.2f}", part.note)
    console.print(table)
    host = estimate_host(shape, plan.fit.settings if plan.fit is not None and plan.fit.fits else settings)
    if host.peak_bytes:
        console.print(
            f"host memory held during the step: {host.peak_gib:.2f} GiB ("
            + ", ".join(f"{part.name} {part.bytes / GIB:.2f}" for part in host.parts if part.bytes)
            + ")"
        )
    code = 0
    if memory is None:
        console.print("No NVIDIA GPU here: give --gpu-memory SIZE to fit the run to a card.")
    else:
        fit = plan.fit
        if fit.fits and not fit.changes:
            console.print(
                f"[green]Fits[/]: needs ≈ {fit.estimate.peak_gib:.1f} GiB of {memory.available / GIB:.1f} "
                f"GiB on {memory.device}." + "".join(f" {note[0].upper()}{note[1:]}." for note in fit.notes)
            )
            if plan.spare is not None:
                console.print(
                    f"With this much to spare {plan.spare.words()} (faster): ≈ {plan.spare.estimate.peak_gib:.1f} GiB."
                )
        elif fit.fits:
            console.print(
                f"[yellow]Does not fit as set[/] ({plan.estimate.peak_gib:.1f} GiB of "
                f"{memory.available / GIB:.1f} GiB on {memory.device}); auto-fit picks: "
                + "; ".join(fit.changes)
                + f" → ≈ {fit.estimate.peak_gib:.1f} GiB."
            )
        else:
            console.print(f"[red]Nothing fits[/] in {memory.available / GIB:.1f} GiB on {memory.device}: {fit.reason}.")
            code = NOTHING_FITS
    if args.json:
        record = {
            "model": config.model.name_or_path,
            "shape": dataclasses.asdict(shape),
            "settings": dataclasses.asdict(settings),
            "mean_row_tokens": plan.mean_row_tokens,
            "peak_gib": plan.estimate.peak_gib,
            "phase": plan.estimate.phase,
            "parts": {part.name: part.bytes / GIB for part in plan.estimate.parts},
            "host_gib": {part.name: part.bytes / GIB for part in host.parts},
            "memory": dataclasses.asdict(memory) if memory else None,
        }
        if plan.fit is not None:
            record["fit"] = {
                "fits": plan.fit.fits,
                "changes": list(plan.fit.changes),
                "reason": plan.fit.reason,
                "settings": dataclasses.asdict(plan.fit.settings),
                "peak_gib": plan.fit.estimate.peak_gib,
                "largest_max_length": plan.fit.largest_max_length,
                "spare": (
                    {
                        "peak_gib": plan.spare.estimate.peak_gib,
                        "whole_mlp": plan.spare.whole_mlp,
                        "kept_layers": plan.spare.kept_layers,
                    }
                    if plan.spare
                    else None
                ),
            }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return code

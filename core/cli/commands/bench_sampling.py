"""`hone bench grpo-…`: GRPO's sampling, Hone's static-cache sampler against transformers' `generate`."""

from __future__ import annotations

from rich.table import Table


def run_sampling(args, console, text_only_flags) -> int:
    """Time the samplers on one batch of prompts × answers, print the table, write --json."""
    from hone.core.api.bench import StepRun, profile_tables, run_sampling_bench, write_json
    from hone.core.errors import ConfigError

    given = [flag for flag, name, default in text_only_flags if getattr(args, name) != default]
    if given or args.only:
        flags = ", ".join(given) or "--only"
        raise ConfigError(
            f"{flags}: not used by the sampling scenario {args.scenario}",
            "it takes --tokens (the answer length), --layers, --lora-r, --steps, --warmup, --profile, --profile-top, "
            "--tokenizer, --peer and --json",
        )

    def measured(run, ratio) -> None:
        if run.error:
            console.print(f"  {run.name}: {run.error}")
        elif isinstance(run, StepRun):
            console.print(f"  whole step, {run.name}: {run.median(args.warmup):.2f} s")
        else:
            console.print(
                f"  {run.name}: {run.tokens_per_s:,.0f} answer tokens/s" + (f" ({ratio:.2f}x)" if ratio else "")
            )

    report = run_sampling_bench(
        args.scenario,
        steps=args.steps,
        warmup=args.warmup,
        layers=args.layers,
        lora_r=args.lora_r,
        completion=args.tokens,
        tokenizer=args.tokenizer,
        profile_top=max(args.profile_top, 1) if args.profile else 0,
        peer=args.peer,
        on_result=measured,
    )
    batch = report.batch
    low, high = batch["prompt_tokens"]
    table = Table(
        title=(
            f"{report.scenario}: {batch['prompts']} prompts x {batch['group']} answers of {batch['completion_tokens']} "
            f"tokens (prompts of {low}-{high} tokens), LoRA r{batch['lora_r']}, {report.dtype} on "
            f"{report.environment.get('gpu', report.device)}; {args.steps} timed calls after "
            f"{args.warmup}; ratios vs generate"
        )
    )
    for column in ("sampler", "answer tokens/s", "seconds per call", "peak GiB", "vs generate", "note"):
        table.add_column(column)
    for run in report.runs:
        ratio = report.ratio(run)
        table.add_row(
            run.name,
            f"{run.tokens_per_s:,.0f}" if run.tokens_per_s else "-",
            f"{sorted(run.seconds)[len(run.seconds) // 2]:.3f}" if run.seconds else "-",
            f"{run.peak_gib:.2f}" if run.peak_gib is not None else "-",
            f"{ratio:.2f}x" if ratio else "-",
            run.error or run.note or run.description,
        )
    console.print(table)
    if report.batch.get("kernels"):
        console.print(f"fused kernels (hone-eager, hone): {report.batch['kernels']}")
    for run in report.runs:
        for renderable in profile_tables(run.name, run.profile) if run.profile is not None else ():
            console.print(renderable)
    if report.steps:
        _print_steps(console, args, report)
    if args.json:
        console.print(f"wrote {write_json(report.to_dict(), args.json)}")
    return 0 if all(not r.error for r in report.runs) else 1


def _print_steps(console, args, report) -> None:
    """The whole GRPO step's table and Hone's ratios against TRL and the peer."""
    peer = f" and {args.peer}'s" if args.peer else ""
    steps = Table(title=f"the whole GRPO step, {args.steps} timed after {args.warmup}: TRL's GRPOTrainer{peer} vs Hone")
    for column in ("trainer", "median step s", "peak GiB", "trainable", "note"):
        steps.add_column(column)
    for run in report.steps:
        median = run.median(args.warmup)
        steps.add_row(
            run.name,
            f"{median:.2f}" if median else "-",
            f"{run.peak_gib:.2f}" if run.peak_gib is not None else "-",
            f"{run.trainable:,}" if run.trainable else "-",
            run.error or run.description,
        )
    console.print(steps)
    for against, who in (("trl", "TRL's"), (args.peer, f"{args.peer}'s")):
        if against and report.step_ratio(against):
            console.print(f"Hone's whole step is {report.step_ratio(against):.2f}x as fast as {who}")

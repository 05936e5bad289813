"""`hone bench SCENARIO [...]`: speed and memory of Hone's speed paths against plain transformers + peft,
in one process, as ratios. Text scenarios go to `hone.core.bench.run`, vision ones to `hone.core.bench.vision`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROFILE_TOP = 25  # default rows per --profile, --memory-trace and --host-profile table
MAX_LENGTH_LIMIT = 1 << 20  # --max-length's default limit (hone.core.bench.max_length.DEFAULT_LIMIT)
# Flags only the text scenarios read, with their defaults: a vision scenario refuses them rather than ignore them.
TEXT_ONLY_FLAGS = (
    ("--qlora", "qlora", False),
    ("--seed", "seed", 0),
    ("--seq-min", "seq_min", None),
    ("--seq-max", "seq_max", None),
    ("--baseline", "baseline", "reference"),
    ("--device", "device", None),
    ("--dtype", "dtype", "auto"),
    ("--micro", "micro", "auto"),
    ("--model-cache", "model_cache", None),
    ("--no-sync-count", "no_sync_count", False),
    ("--memory-trace", "memory_trace", False),
    ("--host-profile", "host_profile", False),
    ("--peak-flops", "peak_flops", None),
    ("--memory-cap", "memory_cap", None),
    ("--lora-experts", "lora_experts", "on"),
    ("--run", "run", None),
    ("--max-length", "max_length", None),
    ("--max-length-from", "max_length_from", None),
)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give run names separated by commas, e.g. reference,all")
    return names


def _size(text: str) -> float:
    from hone.core.api import parse_size
    from hone.core.errors import ConfigError

    try:
        return parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub) -> argparse.ArgumentParser:
    from hone.core.api.bench import SCENARIOS

    p = sub.add_parser(
        "bench",
        help="measure tokens/s and memory against plain transformers + peft",
        description="Train random-init models of real shapes on one packed batch: the transformers + peft "
        "reference, then Hone with each speed path alone and all together. Prints ratios against the "
        "reference (tokens/s, peak memory, first-step loss difference). Vision scenarios (CUDA only) train a "
        "vision-language model on generated text and image rows through Hone's Trainer and through "
        "transformers + peft with padded batches.",
    )
    p.add_argument(
        "scenario", nargs="?", choices=list(SCENARIOS), metavar="SCENARIO", help=f"one of: {', '.join(SCENARIOS)}"
    )
    p.add_argument(
        "--tokens",
        type=int,
        help="tokens in the packed batch (default 16384 dense, 8192 MoE, "
        "512 tiny); vision: tokens per micro-batch (default 8192)",
    )
    p.add_argument("--layers", type=int, help="decoder (text) layers to build (default: the scenario's)")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank, alpha = 2 x rank (default 16)")
    p.add_argument(
        "--lora-experts",
        choices=["on", "off"],
        default="on",
        help="MoE scenarios: LoRA on the expert weights too (default on); off puts Hone and the reference "
        "on the linear layers only, as Unsloth trains MoE models",
    )
    p.add_argument("--qlora", action="store_true", help="4-bit nf4 base weights (bitsandbytes) in every run")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run; the median counts (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch (default 0)")
    p.add_argument("--seq-min", type=int, help="shortest sequence (default 32; tiny scenarios 8)")
    p.add_argument("--seq-max", type=int, help="longest sequence (default 2048; tiny scenarios 256)")
    p.add_argument(
        "--only",
        type=_names,
        metavar="NAMES",
        help="comma-separated runs to make (shell patterns allowed, e.g. 'attn-*,all'); the baseline "
        "and --run runs always run. See --list.",
    )
    p.add_argument(
        "--run",
        action="append",
        metavar="NAME=RUN,SETTING=VALUE,...",
        help="add a run of your own: the listed Hone run RUN with each setting changed (speed.FIELD and "
        "train.FIELD as in `hone train --set`, or bench.per_layer_metadata), shown as NAME; repeatable, e.g. "
        "--run all-groups-4k=all,speed.layer_group_tokens=4096. Without --only it runs against the baseline "
        "alone (add --only all to have `all` beside it). docs/performance/experiments.md has the runs behind "
        "the performance pages",
    )
    p.add_argument("--baseline", default="reference", help="the run ratios are taken against (default reference)")
    p.add_argument("--peer", choices=["unsloth"], help="also run Unsloth in a separate process (if installed)")
    p.add_argument(
        "--memory-cap",
        type=_size,
        metavar="SIZE",
        help="let every run (the peer's too) allocate at most SIZE of GPU memory, e.g. 8GiB, as on a "
        "smaller card; a run that does not fit is reported as out of memory",
    )
    p.add_argument(
        "--max-length",
        type=int,
        nargs="?",
        const=MAX_LENGTH_LIMIT,
        metavar="LIMIT",
        help="instead of the speed table: the longest single row each run (the peer's too) trains in one step, "
        f"under --memory-cap, found by search up to LIMIT tokens (default {MAX_LENGTH_LIMIT:,})",
    )
    p.add_argument(
        "--max-length-from",
        type=int,
        metavar="START",
        help="with --max-length: the first row length tried (default 8,192 on the GPU shapes); lengths double from "
        "it, so START = LIMIT tries that one length first, e.g. when a single step there takes minutes",
    )
    p.add_argument("--json", metavar="OUT", help="write every number, the options and the environment to OUT")
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: cuda when there is one)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="weights and compute (default: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument(
        "--peak-flops",
        type=float,
        metavar="FLOPS",
        help="the device's peak matmul FLOP/s to take MFU against, e.g. 2e12 (default: the rate "
        "measured on the GPU at start; a CPU shows no MFU without it, its rate moves with the load)",
    )
    p.add_argument(
        "--micro",
        default="auto",
        choices=["auto", "on", "off"],
        help="attention-alone micro-benchmark (default: on CUDA)",
    )
    p.add_argument(
        "--model-cache",
        metavar="DIR",
        help="keep the saved random-init model folder (QLoRA and peer runs) here and reuse it next time",
    )
    p.add_argument(
        "--no-sync-count", action="store_true", help="skip the extra forward + backward that counts host syncs"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after each run's timed steps, run one more step under "
        "torch.profiler and print the top kernels by total time with their counts, and the time by "
        "where it was launched (module in forward / recompute, autograd node in backward, optimizer)",
    )
    p.add_argument(
        "--memory-trace",
        action="store_true",
        help="after each run's timed steps, run one more step "
        "with CUDA's allocator history and print what is alive at its peak, grouped by where it was "
        "allocated",
    )
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="after each run's timed steps, run one more step "
        "under Python's cProfile and print where the host's time goes (by function and by package) "
        "and how much of it was spent waiting for the GPU",
    )
    p.add_argument(
        "--profile-top",
        type=int,
        default=PROFILE_TOP,
        metavar="N",
        help=f"rows per profile table (default {PROFILE_TOP})",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="vision scenarios: a folder with SmolLM2's tokenizer (default: read from the bundled GGUF)",
    )
    p.add_argument("--verbose", action="store_true", help="also print each run's speed paths and failures")
    p.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="scaling instead: Hone's `all` run on N processes, one per GPU (gloo processes without a "
        "GPU), each on its own batch, against one process; prints the scaling efficiency",
    )
    p.add_argument(
        "--parallel",
        choices=["ddp", "fsdp"],
        default="ddp",
        help="with --gpus: the whole model on each process (ddp, default) or the decoder layers' frozen "
        "weights split across them (fsdp, as train.parallel = fsdp)",
    )
    p.add_argument("--list", action="store_true", help="list scenarios and runs, then exit")
    return p


# What the scaling measurement (--gpus) reads; anything else it refuses rather than ignore.
SCALING_FLAGS = (
    "scenario",
    "tokens",
    "layers",
    "lora_r",
    "lora_experts",
    "seed",
    "seq_min",
    "seq_max",
    "warmup",
    "steps",
    "dtype",
    "json",
    "gpus",
    "verbose",
    "list",
    "profile_top",
    "parallel",
)


def _run_scaling(args, console) -> int:
    from rich.table import Table

    from hone.core.api.bench import check_processes, efficiency, run_scaling
    from hone.core.errors import ConfigError

    defaults = vars(add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([]))
    extra = sorted(k for k, v in vars(args).items() if k in defaults and k not in SCALING_FLAGS and v != defaults[k])
    if extra:
        raise ConfigError(
            f"--gpus measures Hone's `all` run alone; it does not take --{extra[0].replace('_', '-')}",
            "leave that out, or run the one-GPU benchmark without --gpus",
        )
    spec = {
        "scenario": args.scenario,
        "tokens": args.tokens,
        "layers": args.layers,
        "lora_r": args.lora_r,
        "lora_experts": args.lora_experts == "on",
        "seed": args.seed,
        "seq_min": args.seq_min,
        "seq_max": args.seq_max,
        "warmup": args.warmup,
        "steps": args.steps,
        "dtype": args.dtype,
        "parallel": args.parallel,
    }
    check_processes(args.gpus)
    console.print(
        f"{args.scenario}: Hone `all` on 1 and on {args.gpus} processes ({args.parallel}), each on its own batch ..."
    )
    one, many = run_scaling(spec, args.gpus)
    table = Table(
        title=f"{args.scenario}: scaling over processes ({args.parallel}), median of {args.steps} steps",
        title_justify="left",
    )
    for column in ("processes", "tokens/step", "step s", "tokens/s", "per process", "peak GiB (most)", "efficiency"):
        table.add_column(column, justify="right")
    for run in (one, many):
        peak = f"{max(run.peak_gib_by_process):.2f}" if run.peak_gib_by_process else "-"
        table.add_row(
            str(run.processes),
            f"{run.tokens_per_step:,}",
            f"{run.median_step_s:.3f}",
            f"{run.tokens_per_s:,.0f}",
            f"{run.tokens_per_s / run.processes:,.0f}",
            peak,
            "1.00" if run is one else f"{efficiency(one, many):.2f}",
        )
    console.print(table)
    console.print("efficiency = tokens/s of N processes ÷ (N × tokens/s of one); both launched by torchrun")
    if args.json:
        from dataclasses import asdict

        Path(args.json).write_text(
            json.dumps(
                {
                    "scenario": args.scenario,
                    "options": spec,
                    "gpus": args.gpus,
                    "runs": [asdict(one), asdict(many)],
                    "efficiency": efficiency(one, many),
                },
                indent=2,
            ),
            encoding="utf-8",
        )
    return 0


def _print_list(console) -> None:
    from rich.table import Table

    from hone.core.api.bench import HONE_RUNS as VISION_RUNS
    from hone.core.api.bench import SCENARIOS, VARIANTS

    scenarios = Table(title="scenarios", title_justify="left")
    for column in ("name", "shape", "layers", "tokens", "what"):
        scenarios.add_column(column)
    for s in SCENARIOS.values():
        scenarios.add_row(s.name, s.shape, str(s.layers or "all"), str(s.tokens), s.description)
    console.print(scenarios)
    runs = Table(title="runs (Hone variants are SpeedConfig settings over 'every path off')", title_justify="left")
    for column in ("name", "settings", "needs", "what"):
        runs.add_column(column)
    runs.add_row("reference", "", "", "transformers + peft, HF gradient checkpointing, SDPA, packed row")
    runs.add_row("reference-eager", "", "moe", "the same with transformers' eager experts")
    for v in VARIANTS:
        overrides = {**v.overrides, **{f"train.{k}": value for k, value in v.train.items()}}
        settings = ", ".join(f"{k}={v_}" for k, v_ in overrides.items()) or "(every path off)"
        runs.add_row(v.name, settings, ", ".join(v.needs), v.description)
    console.print(runs)
    console.print(
        "text scenarios take runs of your own too: --run NAME=RUN,SETTING=VALUE,... is the run RUN above with "
        "each setting changed, e.g. --run all-groups-4k=all,speed.layer_group_tokens=4096 "
        "(docs/performance/experiments.md has the runs behind the performance pages)"
    )
    console.print(
        "vision scenarios make two runs: hone (Hone's Trainer, packed rows) and reference (transformers "
        "+ peft, the same rows in padded batches); --peer unsloth adds Unsloth's vision path on those padded "
        "batches, and --only picks other Hone runs: "
        + "; ".join(
            f"{name} ({settings or 'its own choices'})"
            for name, settings in ((name, ", ".join(overrides)) for name, (_, overrides) in VISION_RUNS.items())
        )
    )


def run(args) -> int:
    from rich.console import Console

    from hone.core.errors import ConfigError

    console = Console()
    if not console.is_terminal:  # logs and pipes: room for the whole table
        console = Console(width=150)
    if args.list:
        _print_list(console)
        return 0
    if not args.scenario:
        raise ConfigError("no scenario given", "run `hone bench --list` to see them, e.g. `hone bench dense-0.6b`")
    from hone.core.api.bench import get_scenario

    if args.gpus is None and args.parallel != "ddp":
        raise ConfigError("--parallel is for the scaling measurement", "add --gpus N, e.g. --gpus 2 --parallel fsdp")
    if args.gpus is not None:
        if get_scenario(args.scenario).kind != "text":
            raise ConfigError(
                f"--gpus measures text scenarios; {args.scenario} is a {get_scenario(args.scenario).kind} scenario",
                "give a text scenario, e.g. dense-8b",
            )
        return _run_scaling(args, console)
    if get_scenario(args.scenario).kind == "vision":
        return _run_vision(args, console)
    if get_scenario(args.scenario).kind == "preference":
        return _run_preference(args, console)
    if get_scenario(args.scenario).kind == "sampling":
        from hone.core.cli.commands.bench_sampling import run_sampling

        return run_sampling(args, console, TEXT_ONLY_FLAGS)
    return _run_text(args, console)


def _run_text(args, console) -> int:
    """A text scenario: the transformers + peft reference and Hone's runs, then the ratio table."""
    from hone.core.errors import ConfigError

    if args.tokenizer:
        raise ConfigError(
            f"--tokenizer is for the vision scenarios, not {args.scenario}",
            "leave it out: text scenarios feed token ids, no tokenizer",
        )

    from hone.core.api.bench import BenchOptions, run_bench, write_json

    options = BenchOptions(
        scenario=args.scenario,
        tokens=args.tokens,
        layers=args.layers,
        lora_r=args.lora_r,
        lora_experts=args.lora_experts == "on",
        qlora=args.qlora,
        steps=args.steps,
        warmup=args.warmup,
        seed=args.seed,
        seq_min=args.seq_min,
        seq_max=args.seq_max,
        only=args.only,
        baseline=args.baseline,
        peer=args.peer,
        device=args.device,
        dtype=args.dtype,
        micro=args.micro,
        model_cache=args.model_cache,
        count_syncs=not args.no_sync_count,
        profile_top=max(args.profile_top, 1) if args.profile else 0,
        memory_trace_top=max(args.profile_top, 1) if args.memory_trace else 0,
        host_profile_top=max(args.profile_top, 1) if args.host_profile else 0,
        peak_flops=args.peak_flops,
        memory_cap=args.memory_cap,
        extra_runs=args.run,
    )
    if args.max_length is not None:
        return _run_max_length(args, options, console)
    if args.max_length_from is not None:
        from hone.core.errors import ConfigError

        raise ConfigError(
            "--max-length-from is where --max-length's search starts", "add --max-length [LIMIT] or leave it out"
        )

    started, measured = _progress(console)
    report = run_bench(options, on_result=measured, on_start=started)
    _print_text_report(console, options, report)
    _print_traces(console, args, report.runs)
    if args.verbose:
        _print_details(console, report.runs)
    if args.json:
        path = write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}")
    return 0 if any(r.ok for r in report.runs) else 1


def _run_max_length(args, options, console) -> int:
    """--max-length: each run's longest one-step row, as a table."""
    from hone.core.api.bench import max_length_table, run_max_length, write_json

    def searching(name: str) -> None:
        console.print(f"searching {name} ...")

    report = run_max_length(options, limit=args.max_length, start=args.max_length_from, on_start=searching)
    title = (
        f"{report.scenario}: the longest single row trained in one step, LoRA r{options.lora_r}"
        f"{' QLoRA' if options.qlora else ''}, {report.dtype} on {report.environment.get('gpu', report.device)}"
        f"{_capped(options.memory_cap)}; searched up to {args.max_length:,} tokens"
    )
    console.print(max_length_table(report.runs, title))
    if args.json:
        console.print(f"wrote {write_json(report.to_dict(), args.json)}")
    return 0 if any(r.longest for r in report.runs) else 1


def _print_text_report(console, options, report) -> None:
    """A text scenario's ratio table, MFU note, notes, attention micro-benchmark and --profile tables."""
    from hone.core.api.bench import notes, ratio_table

    batch = report.batch
    title = (
        f"{report.scenario.name} ({report.scenario.description}): {batch['tokens']:,} tokens in "
        f"{batch['sequences']} sequences, LoRA r{options.lora_r}{' QLoRA' if options.qlora else ''}"
        f"{'' if options.lora_experts else ' (none on experts)'}, "
        f"{report.dtype} on {report.environment.get('gpu', report.device)}{_capped(options.memory_cap)}; "
        f"median of {options.steps} steps; "
        f"ratios vs {options.baseline}"
    )
    console.print(ratio_table(report.runs, options.baseline, title))
    counted = ", counting 6 x N FLOPs per token" if report.mfu_roof.flops else ""
    console.print(f"{report.mfu_roof.note}{counted}. syncs = host syncs in one forward + backward (CUDA only).")
    for line in notes(report.runs):
        console.print(f"[yellow]{line}[/yellow]")
    if report.attention_micro is not None:
        micro = report.attention_micro
        if micro.get("status") == "ok" and micro.get("table"):
            console.print(micro["table"])
        else:
            console.print(f"attention alone: {micro.get('status')}: {micro.get('reason')}")
    _print_profiles(console, report.runs)


def _print_traces(console, args, runs) -> None:
    """--memory-trace and --host-profile: each traced run's lines."""
    if args.memory_trace:
        from hone.core.api.bench import memory_lines

        for result in runs:
            if result.memory_trace is not None:
                for line in memory_lines(result.name, result.memory_trace):
                    console.print(line, markup=False, highlight=False)
    if args.host_profile:
        from hone.core.api.bench import host_profile_lines

        for result in runs:
            if result.host_profile is not None:
                for line in host_profile_lines(result.name, result.host_profile):
                    console.print(line, markup=False, highlight=False)


def _capped(cap: float | None) -> str:
    return "" if cap is None else f" capped at {cap / 2**30:g} GiB"


def _run_vision(args, console) -> int:
    """A vision scenario: Hone's Trainer and the transformers + peft reference, then the same ratio table."""
    from hone.core.api.bench import BASELINE, VisionOptions, notes, ratio_table, run_vision_bench, write_json
    from hone.core.errors import ConfigError

    given = [flag for flag, name, default in TEXT_ONLY_FLAGS if getattr(args, name) != default]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: not used by the vision scenario {args.scenario}",
            "it takes --tokens, --layers, --lora-r, --steps, --warmup, --only, --profile, "
            "--profile-top, --tokenizer, --peer, --json and --verbose",
        )
    options = VisionOptions(
        scenario=args.scenario,
        tokens=args.tokens,
        layers=args.layers,
        lora_r=args.lora_r,
        steps=args.steps,
        warmup=args.warmup,
        tokenizer=args.tokenizer,
        peer=args.peer,
        only=args.only,
        profile_top=max(args.profile_top, 1) if args.profile else 0,
    )
    started, measured = _progress(console)
    report = run_vision_bench(options, on_result=measured, on_start=started)
    batch = report.batch
    title = (
        f"{report.scenario.name}: {batch['layers']} text layers, "
        f"{batch['image_rows']} rows with a {batch['image_side']} px image and {batch['text_rows']} text-only, "
        f"{batch['tokens_per_batch']:,} tokens per batch, LoRA r{options.lora_r}, {report.dtype} on "
        f"{report.environment.get('gpu', report.device)}; {options.steps} timed steps after {options.warmup}; "
        f"ratios vs {BASELINE}"
    )
    console.print(ratio_table(report.runs, BASELINE, title))
    console.print(
        "tokens/s counts real (non-padding) tokens over the timed steps. loss is the first step's; the "
        "runs batch the rows differently (packed vs padded), so it is no parity check."
    )
    for line in notes(report.runs):
        console.print(f"[yellow]{line}[/yellow]")
    _print_profiles(console, report.runs)
    if args.verbose:
        _print_details(console, report.runs)
        for name, messages in report.notices.items():
            for message in messages:
                console.print(f"[dim]{name}: {message}[/dim]")
    if args.json:
        path = write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}")
    return 0 if any(r.ok for r in report.runs) else 1


def _run_preference(args, console) -> int:
    """A preference scenario: TRL's DPOTrainer with peft (the baseline) and Hone's DPO, then the ratio table."""
    from hone.core.api.bench import PREFERENCE_BASELINE as BASELINE
    from hone.core.api.bench import VisionOptions, notes, ratio_table, run_preference_bench, write_json
    from hone.core.errors import ConfigError

    given = [flag for flag, name, default in TEXT_ONLY_FLAGS if getattr(args, name) != default]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: not used by the preference scenario {args.scenario}",
            "it takes --tokens, --layers, --lora-r, --steps, --warmup, --tokenizer, --peer, --json and --verbose",
        )
    options = VisionOptions(
        scenario=args.scenario,
        tokens=args.tokens,
        layers=args.layers,
        lora_r=args.lora_r,
        steps=args.steps,
        warmup=args.warmup,
        tokenizer=args.tokenizer,
        peer=args.peer,
        only=args.only,
        profile_top=max(args.profile_top, 1) if args.profile else 0,
    )
    started, measured = _progress(console)
    report = run_preference_bench(options, on_result=measured, on_start=started)
    batch, pairs = report.batch, report.pairs
    title = (
        f"{report.scenario.name}: DPO (beta {batch['beta']}), {batch['layers'] or 'all'} layers, "
        f"{batch['tokens_per_step']:,} tokens a step for Hone, {pairs['trl_pairs_per_step']} pairs a step for TRL "
        f"(pairs of {pairs['mean_tokens']:.0f} tokens on average), LoRA r{options.lora_r}, {report.dtype} on "
        f"{report.environment.get('gpu', report.device)}; {options.steps} timed steps after {options.warmup}; "
        f"ratios vs {BASELINE}"
    )
    console.print(ratio_table(report.runs, BASELINE, title))
    console.print(
        "tokens/s counts real (non-padding) tokens of both sides over the timed steps. parity: the same trainable "
        "parameters and the same first loss (log 2); the runs batch different pairs, so later losses are no check."
    )
    for line in notes(report.runs):
        console.print(f"[yellow]{line}[/yellow]")
    if args.verbose:
        _print_details(console, report.runs)
        for name, messages in report.notices.items():
            for message in messages:
                console.print(f"[dim]{name}: {message}[/dim]")
    if args.json:
        path = write_json(report.to_dict(), args.json)
        console.print(f"wrote {path}")
    return 0 if all(r.ok for r in report.runs) else 1


def _print_profiles(console, runs) -> None:
    """--profile: each profiled run's tables."""
    from hone.core.api.bench import profile_tables

    for result in runs:
        if result.profile is not None:
            for renderable in profile_tables(result.name, result.profile):
                console.print(renderable)


def _progress(console):
    """(on_start, on_result) callbacks that print each run as it starts and as it is measured."""

    def started(name: str) -> None:
        console.print(f"[dim]{name} ...[/dim]")

    def measured(result) -> None:
        if result.ok:
            memory = "" if result.peak_allocated_gib is None else f", {result.peak_allocated_gib:.2f} GiB"
            console.print(
                f"  {result.name}: {result.tokens_per_s:,.0f} tokens/s{memory}, first loss {result.first_loss:.4f}"
            )
        else:
            console.print(f"  {result.name}: {result.status}: {result.reason}")

    return started, measured


def _print_details(console, runs) -> None:
    """--verbose: each run's speed paths and failures."""
    for result in runs:
        for path, choice in result.speed_paths.items():
            console.print(f"[dim]{result.name}: {path}: {choice}[/dim]")
        if result.details:
            console.print(result.details)

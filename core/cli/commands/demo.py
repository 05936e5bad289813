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
        "--method",
        default="sft",
        help="sft (default): the JSON demo; dpo, simpo, orpo or kto: preference training on bundled pairs (the "
        "exact JSON line chosen, a wrong form of it rejected), showing how often base and fine-tune rank held-out "
        "pairs right; grpo: reinforcement learning from rewards (add two numbers, reply with one line of JSON), "
        "showing the reward per step and the held-out reward before and after",
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
    if args.method != "sft":
        # A method the demo does not train with is one line too (ConfigError), before the pairs are written.
        config = demo_config(args.runs_dir, args.steps, args.model, method=args.method)
    unit = {"sft": "rows scored", "grpo": "prompts answered"}.get(args.method, "pairs ranked")
    with EventPrinter() as printer:
        console = printer.console
        convert_gguf_once(config.model, console)
        result = _print_events(
            printer,
            run_demo(
                config,
                eval_rows=args.eval_rows,
                on_stage=lambda text: console.print(f"[bold]{text}"),
                phase=lambda text, total: Phase(console, text, total, unit=unit),
            ),
            on_step=_print_reward if args.method == "grpo" else None,
        )
    if result is None:
        return 1
    if args.method == "grpo":
        return _print_grpo(console, config, result)
    if args.method != "sft":
        return _print_preference(console, config, result)
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


def _print_preference(console, config, result) -> int:
    """The preference demo's table: held-out pairs ranked right and the mean margin, base and fine-tune."""
    from rich.table import Table

    from hone.core.config import PREFERENCE_METHODS

    table = Table(
        title="held-out pairs ranked right (chosen answer more likely per token than rejected); "
        "margin: mean log-probability per token, chosen minus rejected"
    )
    table.add_column("model")
    table.add_column("ranked right", justify="right")
    table.add_column("mean margin", justify="right")
    for name, score in (
        (config.model.name_or_path, result.before),
        (f"+ Hone LoRA ({config.train.method})", result.after),
    ):
        table.add_row(name, f"{score.right}/{score.total} ({100 * score.rate:.0f}%)", f"{score.margin:+.3f}")
    console.print(table)
    console.print(f"held-out pairs: {result.held_out}")
    console.print(f"run folder: {result.run_dir}")
    console.print(f"adapter: {result.adapter_dir}")
    if config.train.method in PREFERENCE_METHODS:
        console.print(f"rank them again: hone eval {result.run_dir} --data {result.held_out}")
    return 0


def run_vision(args) -> int:
    from rich.table import Table

    from hone.core.api import CHANCE, run_vision_demo, vision_demo_config
    from hone.core.cli.console import EventPrinter
    from hone.core.errors import HoneError

    if args.method != "sft":
        raise HoneError(
            f"--method {args.method} is for the text demo: the vision demo trains with sft only",
            "drop --vision for the preference demo, or --method for the vision demo",
        )

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


def _print_reward(console, event) -> None:
    """The GRPO demo's line per step: the mean reward of the step's replies and each reward's mean."""
    if event.reward_mean is None:
        console.print(f"step {event.step}/{event.total_steps}: every reward failed", highlight=False)
        return
    parts = ", ".join(f"{name} {value:.2f}" for name, value in event.rewards.items())
    console.print(
        f"step {event.step}/{event.total_steps}: reward {event.reward_mean:.2f} ± {event.reward_std or 0.0:.2f}"
        f" ({parts}), {event.completion_length or 0.0:.0f} tokens per reply",
        highlight=False,
    )


def _print_grpo(console, config, result) -> int:
    """The GRPO demo's table: the held-out replies' mean reward and how many were fully right, base and fine-tune."""
    import math

    from rich.markup import escape
    from rich.table import Table

    names = list(result.before.by_reward)
    table = Table(
        title=f"held-out replies ({config.grpo.num_generations} sampled per prompt, same seed for both): mean "
        "reward and replies with the full reward"
    )
    table.add_column("model")
    table.add_column("mean reward", justify="right")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("fully right", justify="right")
    for who, score in ((config.model.name_or_path, result.before), ("+ Hone LoRA (grpo)", result.after)):
        table.add_row(
            who,
            f"{score.mean:.3f}",
            *(f"{score.by_reward.get(name, math.nan):.3f}" for name in names),
            f"{score.right}/{score.total} ({100 * score.rate:.0f}%)",
        )
    console.print(table)
    steps = [r for r in result.step_rewards if not math.isnan(r)]
    if steps:
        k, n = max(1, min(5, len(steps) // 2)), len(steps)
        console.print(
            f"training reward, mean over steps 1-{k}: {sum(steps[:k]) / k:.3f}; "
            f"over steps {n - k + 1}-{n}: {sum(steps[-k:]) / k:.3f}"
        )
    question, reply, reward = result.after.examples[0]
    console.print(f"example: {escape(question)}\n         got {escape(reply.strip())!r} (reward {reward:.2f})")
    console.print(f"held-out prompts: {result.held_out}")
    console.print(f"run folder: {result.run_dir}")
    console.print(f"adapter: {result.adapter_dir}")
    return 0


def _print_events(printer, demo, on_step=None):
    """Print each event a demo generator yields (`on_step(console, event)` also hears each step); return the
    generator's result."""
    from hone.core.events import StepMetrics

    try:
        while True:
            event = next(demo)
            printer.handle(event)
            if on_step is not None and isinstance(event, StepMetrics):
                on_step(printer.console, event)
    except StopIteration as done:
        return done.value

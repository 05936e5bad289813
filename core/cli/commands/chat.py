"""`hone chat RUN_DIR [--base] [--system TEXT] [--max-new-tokens N] [--temperature T] [--top-p P]
[--repetition-penalty R]`.

Talk to a fine-tune in the terminal: the run's base model with its adapter (or without, --base), prompts rendered
with the chat template saved with the run's adapter, replies streamed token by token, the conversation kept until
/reset. With stdin a pipe there are no prompt decorations: each non-empty input line gets one reply on stdout.

`open_chat_run` and `load_chat_models` are shared with `hone generate`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from hone.core.errors import HoneError

EXIT_COMMANDS = ("/exit", "/quit")
RESET_COMMAND = "/reset"
HELP_COMMAND = "/help"
_HELP = "/reset starts a new conversation, /exit (or Ctrl-D) quits, Ctrl-C stops a reply"


def add_generation_options(p: argparse.ArgumentParser) -> None:
    """--base, --system, --max-new-tokens, --temperature, --top-p, --repetition-penalty, --seed: shared by
    `hone chat` and `hone generate`, with the Studio's Chat defaults."""
    from hone.core.api import CHAT_REPETITION_PENALTY, GenerationSettings

    defaults = GenerationSettings()
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="the run folder `hone train` wrote (holds config.toml and adapter/)"
    )
    p.add_argument(
        "--base", action="store_true", help="the base model without the run's adapter (same chat template), to compare"
    )
    p.add_argument("--system", default="", metavar="TEXT", help="a system message to start every conversation with")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=defaults.max_new_tokens,
        metavar="N",
        help=f"longest reply in tokens (default: {defaults.max_new_tokens})",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=defaults.temperature,
        metavar="T",
        help=f"0 = greedy, the same reply every time; higher samples more freely (default: {defaults.temperature:g})",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=defaults.top_p,
        metavar="P",
        help="with a temperature above 0, sample only from the most likely tokens whose probability adds up to P "
        f"(default: {defaults.top_p:g}, all of them)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=CHAT_REPETITION_PENALTY,
        metavar="R",
        help="above 1, tokens already in the conversation become less likely, which ends a small model's loops; "
        f"1 = off (default: {CHAT_REPETITION_PENALTY:g}, as the Studio's Chat)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help=f"sampling seed when the temperature is above 0 (default: {defaults.seed})",
    )


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "chat",
        help="chat with a fine-tuned run in the terminal (streaming)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat with a run's fine-tuned model: its base model with the adapter, prompts in "
        "the chat template the run trained with, replies streamed as they are generated.\n\n"
        f"In the chat: {_HELP}.\nWith stdin a pipe (`hone chat RUN < questions.txt`): no prompts or "
        "notes, one reply per non-empty input line, the conversation kept across lines.\n\n"
        "exit codes: 0 done, 2 not a run folder / no adapter yet / base model missing",
    )
    add_generation_options(p)
    return p


def open_chat_run(run_dir: str, base: bool) -> tuple[Path, object]:
    """The run folder and its RunConfig, checked before anything loads.

    Args:
        run_dir: the run folder, or its adapter/ folder.
        base: the base alone will be used, so a run without an adapter is fine.

    Raises:
        HoneError: not a run folder, no adapter yet (unless `base`), or the base model is gone; with what to do.
    """
    from hone.core.api import ADAPTER_DIR, CONFIG_FILE, INTERRUPTED, check_model, live_summary
    from hone.core.config import RunConfig

    path = Path(run_dir).expanduser()
    if path.name == ADAPTER_DIR and (path.parent / CONFIG_FILE).is_file():
        path = path.parent
    if not path.is_dir():
        raise HoneError(f"{path} does not exist", "give the folder of a run (runs/<name>)")
    if not (path / CONFIG_FILE).is_file():
        raise HoneError(
            f"{path} is not a run folder (it has no {CONFIG_FILE})",
            "give the folder `hone train` wrote for the run (runs/<name>)",
        )
    config = RunConfig.load(path / CONFIG_FILE)
    if not base and not (path / ADAPTER_DIR / "adapter_config.json").is_file():
        summary = live_summary(path)
        status = summary.status if summary else "unknown"
        if status == "running":
            advice = (
                "the run is still training: wait for it to finish or stop it (stopping saves the adapter); "
                "--base chats with the base model meanwhile"
            )
        elif status == INTERRUPTED:
            advice = (
                f"the run was interrupted at step {summary.step} ({summary.reason}): resume it with "
                f"`hone train --resume {path}`, or use --base"
            )
        elif status == "failed":
            advice = f"the run failed ({summary.reason}); fix that and train again, or use --base"
        else:
            advice = f"finish or resume the run first (`hone train --resume {path}`), or use --base"
        raise HoneError(
            f"run {path.name} has no adapter yet ({path / ADAPTER_DIR / 'adapter_config.json'} is missing)", advice
        )
    check_model(config.model, given_as=f"model.name_or_path in {path / CONFIG_FILE}")
    return path, config


def load_chat_models(run_dir: Path, config, base: bool, console):
    """ChatModels for the run (its adapter unless `base`), loaded under progress lines on `console`."""
    from hone.core.api import ChatModels
    from hone.core.cli.console import Phase, convert_gguf_once

    convert_gguf_once(config.model, console)  # the base's first load here: a GGUF conversion
    what = "the base model" if base else "the base model and the run's adapter"
    with Phase(console, f"loading {what} ({config.model.name_or_path})"):
        return ChatModels.for_run(run_dir, adapter=not base)


def settings_from(args):
    """GenerationSettings from the options (a ConfigError, exit 2, for a value that cannot work)."""
    from hone.core.api import GenerationSettings

    return GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
    )


def run(args) -> int:
    from rich.console import Console

    settings = settings_from(args)  # a bad value: one line, before anything loads
    run_dir, config = open_chat_run(args.run_dir, args.base)
    console = Console(stderr=True)  # notes and progress on stderr: stdout holds only the replies
    models = load_chat_models(run_dir, config, args.base, console)
    interactive = sys.stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):  # not on Windows
            import readline  # noqa: F401  (line editing and history for input())
        model = "base model, no adapter" if args.base else "fine-tuned"
        console.print(f"chatting with {run_dir.name} ({model}); {_HELP}", highlight=False, soft_wrap=True)
    return chat_loop(models, settings, args.system, use_adapter=not args.base, interactive=interactive, console=console)


def chat_loop(models, settings, system: str, *, use_adapter: bool, interactive: bool, console) -> int:
    """Read a line, stream the reply, repeat until /exit or end of input. Returns the exit code (0)."""
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    while True:
        line = _read_line(interactive)
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if text in EXIT_COMMANDS:
            return 0
        if text == RESET_COMMAND:
            messages = list(start)
            if interactive:
                console.print("(new conversation)", style="dim", highlight=False)
            continue
        if text == HELP_COMMAND and interactive:
            console.print(_HELP, highlight=False)
            continue
        messages.append({"role": "user", "content": text})
        reply = _stream_reply(models, messages, settings, use_adapter)
        messages.append({"role": "assistant", "content": reply})


def _read_line(interactive: bool) -> str | None:
    """The next line of input (None at end of input): a prompt on a terminal, a plain read from a pipe."""
    if interactive:
        try:
            return input("> ")
        except EOFError:
            print()
            return None
    line = sys.stdin.readline()
    return line if line else None


def _stream_reply(models, messages, settings, use_adapter: bool) -> str:
    """Print the reply to stdout as it is generated and return it; Ctrl-C ends it early (what came so far stays in
    the conversation)."""
    import threading

    stop = threading.Event()
    pieces: list[str] = []
    try:
        for piece in models.stream(messages, settings, use_adapter=use_adapter, stop=stop):
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stop.set()
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(pieces)

"""`hone`: everything the GUI does, headless.

Each subcommand lives in its own module that defines `add_parser(subparsers)` and `run(args) -> int`; this file
only dispatches, so `hone --help` stays fast (no torch import until a command needs it). User mistakes end as
one clear line plus advice (exit 2); unexpected failures keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hone.core import __version__
from hone.core.errors import HoneError

# name -> module implementing it. Order is the order of `hone --help`.
COMMANDS = {
    "train": "hone.core.cli.commands.train",
    "demo": "hone.core.cli.commands.demo",
    "bench": "hone.core.cli.commands.bench",
    "data": "hone.core.cli.commands.data",
    "export": "hone.core.cli.commands.export",
    "studio": "hone.app.studio_command",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hone", description="Hone Studio: fine-tune LLMs and vision-language "
                                     "models on one NVIDIA GPU.")
    parser.add_argument("--version", action="version", version=f"hone {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        module = importlib.import_module(module_name)
        command = module.add_parser(sub)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except HoneError as e:
        print(f"hone: error: {e.message}", file=sys.stderr)
        if e.advice:
            print(f"hone: advice: {e.advice}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hone: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

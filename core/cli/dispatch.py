"""`hone`: everything the GUI does, headless.

Each subcommand lives in its own module that defines `add_parser(subparsers)` and `run(args) -> int`; this file
only dispatches, so `hone --help` stays fast (no torch import until a command needs it). User mistakes end as
one clear line plus advice (exit 2); unexpected failures keep their traceback.

Commands from other packages come in through the `hone.commands` entry point group (`name = "package.module"`,
declared in their pyproject.toml); the desktop app adds `studio` this way, so hone.core never imports the GUI.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import EntryPoint, distributions

from hone.core.errors import HoneError, record_failure
from hone.core.version import __version__

# Built-in commands: name -> module implementing it. Order is the order of `hone --help`; entry point commands
# follow, sorted by name.
COMMANDS = {
    "train": "hone.core.cli.commands.train",
    "demo": "hone.core.cli.commands.demo",
    "bench": "hone.core.cli.commands.bench",
    "data": "hone.core.cli.commands.data",
    "export": "hone.core.cli.commands.export",
    "push": "hone.core.cli.commands.push",
    "chat": "hone.core.cli.commands.chat",
    "generate": "hone.core.cli.commands.generate",
    "eval": "hone.core.cli.commands.eval",
    "compare": "hone.core.cli.commands.compare",
    "init": "hone.core.cli.commands.init",
    "plan": "hone.core.cli.commands.plan",
    "models": "hone.core.cli.commands.models",
}
ENTRY_POINT_GROUP = "hone.commands"


def entry_point_commands() -> list[EntryPoint]:
    """The `hone.commands` entry points, sorted by name; one per name (the first on sys.path), none that would
    replace a built-in."""
    found: dict[str, EntryPoint] = {}
    # Every copy of every package's metadata, not only the first copy per package as `entry_points()` reads: a
    # stale hone_studio.egg-info left in a source checkout comes first on sys.path under `python -m` and pytest,
    # and would hide the commands declared since it was written.
    for dist in distributions():
        for entry in dist.entry_points.select(group=ENTRY_POINT_GROUP):
            if entry.name not in COMMANDS:
                found.setdefault(entry.name, entry)
    return [found[name] for name in sorted(found)]


def _add_command(sub, add_parser, run) -> None:
    command = add_parser(sub)
    command.set_defaults(_run=run)


def _add_unloadable(sub, entry: EntryPoint, error: Exception) -> None:
    """A command whose module does not load stays listed; running it says why, and the other commands still work."""
    message = f"the `hone {entry.name}` command ({entry.value}) cannot be loaded: {type(error).__name__}: {error}"
    package = entry.dist.name if entry.dist is not None else "the package that declares it"
    advice = f"reinstall {package} (in a source checkout: pip install -e .)"
    command = sub.add_parser(entry.name, help="(cannot be loaded: run it to see why)", description=message)

    def run(args) -> int:
        raise HoneError(message, advice)

    command.set_defaults(_run=run, _any_arguments=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hone", description="Hone Studio: fine-tune LLMs and vision-language models on one NVIDIA GPU."
    )
    parser.add_argument("--version", action="version", version=f"hone {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        module = importlib.import_module(module_name)
        _add_command(sub, module.add_parser, module.run)
    for entry in entry_point_commands():
        try:
            module = entry.load()
            add_parser, run = module.add_parser, module.run
        except Exception as e:  # whatever a broken plugin raises, the built-in commands must keep working
            _add_unloadable(sub, entry, e)
        else:
            _add_command(sub, add_parser, run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")  # what parse_args says
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from hone.core.api import prefer_expandable_segments
    from hone.core.cli.console import quiet_library_noise

    prefer_expandable_segments()  # before anything touches CUDA (hone.core.machine.allocator says why)
    quiet_library_noise()  # every command: messages from the libraries that a user cannot act on
    try:
        return int(args._run(args) or 0)
    except HoneError as e:
        record_failure(e)
        print(f"hone: error: {e.message}", file=sys.stderr)
        if e.advice:
            print(f"hone: advice: {e.advice}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hone: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`hone`: everything the GUI does, headless. `dispatch` builds the parser and runs a command; each command is a
module in `commands/` with `add_parser(subparsers)` and `run(args) -> int`; `console` prints a run's events."""

from hone.core.cli.dispatch import COMMANDS, ENTRY_POINT_GROUP, build_parser, entry_point_commands, main

__all__ = ["COMMANDS", "ENTRY_POINT_GROUP", "build_parser", "entry_point_commands", "main"]

"""How Hone Studio is started: `hone studio` (a `hone` command the app adds through the `hone.commands` entry
point group), the `hone-studio` GUI script, and the options both take.

Nothing here imports Qt at module level, so `hone --help` and `hone studio --help` stay fast; the window itself is
built by `hone.app.main.run`, imported only when the app starts.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from hone.core.errors import HoneError

PAGES = ("model", "data", "train", "monitor", "chat", "export", "runs")
# The third-party packages the window is built from: when one does not import, the user has an install to fix.
GUI_PACKAGES = ("PySide6.QtWidgets", "pyqtgraph")


def add_parser(sub) -> argparse.ArgumentParser:
    """`hone studio`, for `hone.core.cli` (the `studio` entry point of the `hone.commands` group)."""
    p = sub.add_parser(
        "studio",
        help="open Hone Studio, the desktop app",
        description="Open Hone Studio. With --screenshot, render a page offscreen to a PNG and exit.",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `hone studio` and `hone-studio` (one definition for both)."""
    p.add_argument("--screenshot", metavar="FILE", help="render a page to this PNG file offscreen, then exit")
    p.add_argument("--page", choices=PAGES, help="the page to open (default: the last one used)")
    p.add_argument("--size", metavar="WxH", type=parse_size, help="window size in pixels, e.g. 1440x900")
    p.add_argument("--theme", choices=("system", "light", "dark"), help="colour theme (default: follow the system)")
    p.add_argument("--model", metavar="NAME_OR_PATH", help="choose this model (Hugging Face id, folder or .gguf)")
    p.add_argument("--data", metavar="FILE", action="append", help="use this training data file (repeatable)")
    p.add_argument(
        "--run",
        metavar="RUN_DIR",
        action="append",
        help="open this run folder in the Monitor; repeated, the runs (of one runs folder) are also selected on Runs, "
        "which compares them",
    )


def parse_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if not match or not (320 <= int(match.group(1)) <= 10000 and 240 <= int(match.group(2)) <= 10000):
        raise argparse.ArgumentTypeError(f"{text!r} is not a window size like 1440x900 (320x240 and up)")
    return int(match.group(1)), int(match.group(2))


def run(args: argparse.Namespace) -> int:
    """Open the app (or take the screenshot). A GUI package that does not import is a `HoneError` (one line plus
    advice); any other failure keeps its traceback."""
    from hone.core.api import guard_bitsandbytes_import, prefer_expandable_segments

    for folder in args.run or []:
        if not (Path(folder) / "config.toml").is_file():
            raise HoneError(
                f"{folder} is not a run folder (it has no config.toml)",
                "give a folder from the runs directory, e.g. runs/20261201-120000-my-model",
            )
    if len({Path(folder).resolve().parent for folder in args.run or []}) > 1:
        raise HoneError(
            "the runs given with --run are in different runs folders",
            "the Runs page lists one runs folder: give runs of one folder to compare",
        )
    prefer_expandable_segments()  # training runs in this process: set before anything touches CUDA
    guard_bitsandbytes_import()  # before peft imports it (hone.core.models.hub_kernels says why)
    for name in GUI_PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise HoneError(
                f"the desktop app cannot start: {e}",
                "install the GUI dependencies: pip install pyside6-essentials pyqtgraph",
            ) from None
    from hone.app.main import run as start_app

    return start_app(args)


def main(argv: list[str] | None = None) -> int:
    """The `hone-studio` GUI script."""
    parser = argparse.ArgumentParser(prog="hone-studio", description="Hone Studio: fine-tune LLMs on one GPU.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except HoneError as e:
        print(f"hone-studio: error: {e.message}\nhone-studio: advice: {e.advice}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

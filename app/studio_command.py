"""`hone studio`: open the desktop app, or render one page to a PNG and exit (`--screenshot`)."""

from __future__ import annotations

import argparse
import importlib
import re

from hone.core.errors import ConfigError

PAGES = ("model", "data", "train", "monitor", "chat", "export", "runs")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("studio", help="open Hone Studio, the desktop app",
                       description="Open Hone Studio. With --screenshot, render a page offscreen to a PNG and exit.")
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
    p.add_argument("--run", metavar="RUN_DIR", help="open this run folder in the Monitor")


def parse_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if not match or not (320 <= int(match.group(1)) <= 10000 and 240 <= int(match.group(2)) <= 10000):
        raise argparse.ArgumentTypeError(f"{text!r} is not a window size like 1440x900 (320x240 and up)")
    return int(match.group(1)), int(match.group(2))


def run(args) -> int:
    # The GUI is the one part of Hone the command line starts but never imports at module level: it is looked up
    # by name here so that `hone` without `studio` loads no Qt (hone.core never depends on hone.app).
    try:
        studio = importlib.import_module("hone.app.main")
    except ImportError as e:
        raise ConfigError(f"the desktop app cannot start: {e}",
                          "install the GUI dependencies: pip install pyside6-essentials pyqtgraph") from None
    return studio.run(args)

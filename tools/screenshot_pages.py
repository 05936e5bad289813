"""Screenshots of every Studio page in the light and the dark theme (PAGE-THEME.png), and of the Runs page comparing
runs (runs-compare-THEME.png), rendered offscreen from real run folders.

    python3 tools/screenshot_pages.py RUN_DIR [RUN_DIR ...] [--out docs/screenshots] [--size 1440x900]
        [--compare-size 1440x1700]

The first run is opened in the Monitor, Chat and Export, and its model and training data are chosen on the Model,
Data and Train pages; with two runs or more (of one runs folder), all of them are compared on Runs. Each picture is
`hone studio --screenshot` in a process of its own, so one page's state never leaks into another's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

PAGES = ("model", "data", "train", "monitor", "chat", "export", "runs")
THEMES = ("light", "dark")


def run_choices(run_dir: Path) -> list[str]:
    """--model and --data as the run was trained (from its config.toml)."""
    from hone.core.config import RunConfig

    config = RunConfig.load(run_dir / "config.toml")
    args = ["--model", config.model.name_or_path]
    for path in config.data.train:
        args += ["--data", path]
    return args


def render(out: Path, page: str, theme: str, size: str, runs: list[Path]) -> None:
    command = [sys.executable, "-m", "hone.core.cli", "studio", "--screenshot", str(out), "--page", page]
    command += ["--theme", theme, "--size", size, *run_choices(runs[0])]
    for run_dir in runs:
        command += ["--run", str(run_dir)]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"{out.name}: hone studio exited {done.returncode}\n{done.stderr[-2000:]}")
    print(f"saved {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run folders; the first is shown")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"), help="folder for the PNG files")
    parser.add_argument("--size", default="1440x900", help="window size, WxH")
    parser.add_argument(
        "--compare-size", default="1440x1700", help="window size of the comparison, tall enough for its tables"
    )
    args = parser.parse_args(argv)
    for run_dir in args.runs:
        if not (run_dir / "config.toml").is_file():
            parser.error(f"{run_dir} is not a run folder (it has no config.toml)")
    args.out.mkdir(parents=True, exist_ok=True)
    for theme in THEMES:
        for page in PAGES:
            render(args.out / f"{page}-{theme}.png", page, theme, args.size, args.runs[:1])
        if len(args.runs) > 1:
            render(args.out / f"runs-compare-{theme}.png", "runs", theme, args.compare_size, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

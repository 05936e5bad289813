"""`hone compare RUN RUN… [--json OUT]`: the settings that differ between runs, and each run's numbers.

Settings come from each run's config.toml (every key, defaults filled in, flattened to `section.key`); numbers from
its metrics.jsonl events (read as the run history reads them: a line that holds no event is skipped and counted) and
its run.json status (a run.json that cannot be read says "damaged" and why). A run folder with a damaged file is
still compared as far as its other files allow; only a folder that is no run at all is refused. The reading and the
wording live in the engine (hone.core.api: read_run, metric_text, setting_text), which the Studio's Runs page shares.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "compare",
        help="the settings that differ between runs, and their losses, speed and memory",
        description="Compare run folders: a table of only the settings that differ (from each run's "
        "config.toml) and a table of each run's numbers from its metrics.jsonl: final and best eval loss, "
        "final train loss, median tokens/s, peak GPU memory, wall time, steps and status.\n\n"
        "exit codes: 0 done, 2 bad input (fewer than two runs, a folder that is no run)",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders `hone train` wrote (two or more)")
    p.add_argument("--json", metavar="OUT", help="also write the comparison as JSON to OUT")
    return p


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from hone.core.api import (
        METRIC_COLUMNS,
        comparison,
        differing_settings,
        metric_text,
        read_run,
        setting_text,
        unique_names,
    )

    if len(args.runs) < 2:
        raise HoneError("hone compare needs two or more run folders", "give them all: hone compare runs/a runs/b")
    runs = [read_run(Path(r)) for r in args.runs]
    unique_names(runs)
    console = Console()
    differing = differing_settings(runs)
    if differing:
        table = Table(title="settings that differ", show_edge=False, header_style="bold")
        table.add_column("setting")
        for r in runs:
            table.add_column(escape(r.name))
        for key, values in differing.items():
            table.add_row(key, *(escape(setting_text(v)) for v in values))
        console.print(table)
    else:
        console.print("[dim]every setting is the same in these runs[/]")
    table = Table(title="numbers", show_edge=False, header_style="bold")
    table.add_column("run")
    for key, header in METRIC_COLUMNS:
        table.add_column(header, justify="left" if key == "status" else "right")
    for r in runs:
        status = r.metrics["status"]
        style = {"finished": "green", "failed": "red", "damaged": "red"}.get(status, "yellow")
        cells = [f"[{style}]{escape(status)}[/]"]
        cells += [metric_text(key, r.metrics) for key, _ in METRIC_COLUMNS[1:]]
        table.add_row(escape(r.name), *cells)
    console.print(table)
    for r in runs:
        for problem in r.problems:
            console.print(f"[yellow]{escape(r.name)}: {escape(problem)}[/]")
    if args.json:
        out = Path(args.json)
        try:
            out.write_text(json.dumps(comparison(runs), indent=2, allow_nan=False) + "\n", encoding="utf-8")
        except OSError as e:
            raise HoneError(f"--json {out} cannot be written: {e.strerror or e}", "give a writable path") from None
        console.print(f"[dim]written to {escape(str(out))}[/]")
    return 0

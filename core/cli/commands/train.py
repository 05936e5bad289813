"""`hone train CONFIG [--set k=v ...] [--resume RUN_DIR]`."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train.run_dir import CONFIG_FILE


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="fine-tune a model as a config file describes",
                       description="Fine-tune a model. Ctrl-C stops after the current step and saves a checkpoint "
                       "and the adapter; a second Ctrl-C aborts.")
    p.add_argument("config", nargs="?", help="a run config (TOML); optional with --resume")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    return p


def load_run_config(config_path: str | None, resume: str | None, overrides: list[str]) -> RunConfig:
    if resume:
        stored = Path(resume) / CONFIG_FILE
        if not stored.is_file():
            raise HoneError(f"{resume} is not a run folder (no {CONFIG_FILE})", "give the folder a run wrote")
        config = RunConfig.load(config_path or stored)
    elif config_path:
        config = RunConfig.load(config_path)
    else:
        raise HoneError("no config given", "run `hone train CONFIG.toml` or `hone train --resume RUN_DIR`")
    return config.with_overrides(overrides) if overrides else config


def run(args) -> int:
    from hone.core.train.input_checks import check_inputs

    config = load_run_config(args.config, args.resume, args.overrides)
    check_inputs(config)  # before torch loads or a run folder exists: a wrong path is one line, exit 2
    from hone.core.cli.console import EventPrinter
    from hone.core.control import RunControl
    from hone.core.events import RunFailed
    from hone.core.train.trainer import Trainer

    control = RunControl()

    def on_interrupt(signum, frame):
        if control.stop_requested:
            raise KeyboardInterrupt
        control.stop()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with EventPrinter() as printer:
            for event in Trainer(config, control, resume_dir=args.resume).run():
                printer.handle(event)
    finally:
        signal.signal(signal.SIGINT, previous)
    return 1 if isinstance(printer.last, RunFailed) else 0

"""`hone train CONFIG [--set k=v ...] [--resume RUN_DIR [--data-changed MODE]]`."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train.resume_checks import DATA_CHANGED, check_resume
from hone.core.train.run_dir import CONFIG_FILE


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="fine-tune a model as a config file describes",
                       description="Fine-tune a model. Ctrl-C stops after the current step and saves a checkpoint "
                       "and the adapter; a second Ctrl-C aborts.")
    p.add_argument("config", nargs="?", help="a run config (TOML); optional with --resume")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=1e-4 (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint, with the run's "
                   "config.toml (or CONFIG) and --set: the learning rate, schedule and length (train.lr, max_steps, "
                   "epochs, warmup) are laid out anew from the next step, how steps run or save (speed.*, "
                   "output.checkpoint_every, ...) may change, and a setting that changes what is trained or where "
                   "in the data the run is (model, lora, data, batch_tokens, seed, ...) is refused; the run's "
                   "config.toml is updated (the one before kept as config.N.toml) and train.log says what changed")
    p.add_argument("--data-changed", choices=DATA_CHANGED, metavar="MODE",
                   help="with --resume, when the training files differ from those the checkpoint was trained on "
                   "(size and sha256 of each): refuse (the default) stops and names them; restart-epoch trains on "
                   "the new data from the start of the current epoch; continue keeps the place in the data order")
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

    if args.data_changed and not args.resume:
        raise HoneError("--data-changed only applies with --resume", "drop it, or add --resume RUN_DIR")
    config = load_run_config(args.config, args.resume, args.overrides)
    check_inputs(config)  # before torch loads or a run folder exists: a wrong path is one line, exit 2
    data_changed = args.data_changed or "refuse"
    if args.resume:
        check_resume(args.resume, config, data_changed)  # a change it refuses: one message, exit 2, nothing written
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
            for event in Trainer(config, control, resume_dir=args.resume, data_changed=data_changed).run():
                printer.handle(event)
    finally:
        signal.signal(signal.SIGINT, previous)
    return 1 if isinstance(printer.last, RunFailed) else 0

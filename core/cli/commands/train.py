"""`hone train CONFIG [--set k=v ...] [--resume RUN_DIR [--data-changed MODE]] [--rerun RUN_DIR] [--gpus N]`.

With `--gpus N` (N > 1, or several machines) it starts torchrun, which runs this command once per GPU; each of
those processes finds its place in the environment torchrun sets (hone.core.train.distributed)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hone.core.api import CONFIG_FILE, DATA_CHANGED, check_resume
from hone.core.cli import launch as launcher
from hone.core.cli import stop_signals
from hone.core.config import RunConfig
from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="fine-tune a model as a config file describes",
        description="Fine-tune a model. Ctrl-C stops after the current step and saves a checkpoint "
        "and the adapter; a second Ctrl-C aborts.",
        epilog="SIGTERM and SIGHUP (kill, docker stop, a scheduler, a closed terminal; on Windows the console's "
        "Ctrl-Break, close, logoff and shutdown) stop and save the same way, waiting at most "
        f"{stop_signals.GRACE_ENV} seconds (default {stop_signals.DEFAULT_GRACE_S:g}) for the step in flight; a "
        "second signal ends at once, with the last complete checkpoint. Exit codes: 0 finished or stopped with "
        f"Ctrl-C, 1 failed, 2 refused (nothing trained), {stop_signals.EXIT_STOPPED_BY_SYSTEM} ended early by the "
        "system or a GPU that stopped working (go on with --resume RUN_DIR), 130 aborted with a second Ctrl-C.",
    )
    p.add_argument("config", nargs="?", help="a run config (TOML); optional with --resume")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.lr=1e-4 (repeatable)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest checkpoint, with the run's "
        "config.toml (or CONFIG) and --set: the learning rate, schedule and length (train.lr, max_steps, "
        "epochs, warmup) are laid out anew from the next step, how steps run or save (speed.*, "
        "output.checkpoint_every, ...) may change, and a setting that changes what is trained or where "
        "in the data the run is (model, lora, data, batch_tokens, seed, ...) is refused; the run's "
        "config.toml is updated (the one before kept as config.N.toml) and train.log says what changed",
    )
    p.add_argument(
        "--data-changed",
        choices=DATA_CHANGED,
        metavar="MODE",
        help="with --resume, when the training files differ from those the checkpoint was trained on "
        "(size and sha256 of each): refuse (the default) stops and names them; restart-epoch trains on "
        "the new data from the start of the current epoch; continue keeps the place in the data order",
    )
    p.add_argument(
        "--rerun",
        metavar="RUN_DIR",
        help="a new run with the settings of RUN_DIR's config.toml (and --set): after its first step it says "
        "whether the first-step loss matches the original's and which recorded versions (provenance.json: "
        "model revision, torch, transformers, peft, GPU, driver, CUDA, seed, ...) differ",
    )
    several = p.add_argument_group(
        "several GPUs",
        "one process per GPU through torchrun; each step's rows are "
        "shared out, so a step trains the same tokens as on one GPU",
    )
    several.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs of this machine to train on")
    several.add_argument(
        "--nnodes",
        type=int,
        default=1,
        metavar="M",
        help="machines taking part (the same "
        "command on each, with its --node-rank; the run folder on storage they share)",
    )
    several.add_argument("--node-rank", type=int, default=0, metavar="K", help="this machine's number, 0 to M-1")
    several.add_argument("--master-addr", metavar="HOST", help="address of machine 0 (with --nnodes > 1)")
    several.add_argument("--master-port", type=int, default=29500, metavar="PORT", help="its port (default 29500)")
    return p


def load_run_config(
    config_path: str | None, resume: str | None, overrides: list[str], rerun: str | None = None
) -> RunConfig:
    if rerun:
        if resume or config_path:
            raise HoneError(
                "--rerun takes its settings from the run folder's config.toml",
                "drop CONFIG and --resume (change a setting with --set KEY=VALUE)",
            )
        stored = Path(rerun) / CONFIG_FILE
        if not stored.is_file():
            raise HoneError(f"{rerun} is not a run folder (no {CONFIG_FILE})", "give --rerun the folder a run wrote")
        config = RunConfig.load(stored)
    elif resume:
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
    from hone.core.api import check_inputs

    if args.data_changed and not args.resume:
        raise HoneError("--data-changed only applies with --resume", "drop it, or add --resume RUN_DIR")
    launch = launcher.wanted(args)
    config = load_run_config(args.config, args.resume, args.overrides, args.rerun)
    grace_s = stop_signals.grace_seconds()  # a value it cannot use: one line, exit 2, before anything loads
    check_inputs(config)  # before torch loads or a run folder exists: a wrong path is one line, exit 2
    data_changed = args.data_changed or "refuse"
    if args.resume:
        check_resume(args.resume, config, data_changed)  # a change it refuses: one message, exit 2, nothing written
    if launch:
        return launcher.run_torchrun(args, grace_s)
    from hone.core.api import Trainer, process_world
    from hone.core.cli.console import EventPrinter
    from hone.core.control import PAUSE_FILE_ENV, RunControl, follow_pause_file
    from hone.core.errors import record_failure
    from hone.core.events import RunFailed, RunFinished

    control = RunControl()
    world = process_world()
    trainer = Trainer(config, control, resume_dir=args.resume, data_changed=data_changed, world=world)
    requests = stop_signals.StopRequests(
        control,
        saving=trainer.saving,
        merge_repeats=world.launched,
        grace_s=grace_s,
        run_dir=lambda: str(trainer.writer.run_dir if trainer.writer else args.resume or "RUN_DIR"),
    )
    launcher.watch_stop_file(control, os.environ.get(launcher.STOP_FILE_ENV))  # set by `hone train --gpus N`
    follow_pause_file(control, os.environ.get(PAUSE_FILE_ENV))  # set by the studio for a run in its own process
    # under torchrun, SIGTERM ends the others when one process fails: said in the run's log (stopped_by_torchrun)
    with stop_signals.stop_requests_wired(requests, launched=world.launched, peer_ended=launcher.stopped_by_torchrun):
        try:
            with EventPrinter() if world.main else launcher.FailurePrinter(world.rank) as printer:
                shown = RerunCheck(printer, args.rerun, trainer) if args.rerun and world.main else printer
                launcher.print_run(trainer.run(), shown)
        finally:
            requests.finished()  # the run has ended: nothing left for the grace period to end
    last = printer.last
    if isinstance(last, RunFinished) and not last.stopped and trainer.config.train.eval_checkpoints and world.main:
        score_checkpoints_after(trainer)
    if isinstance(last, RunFailed):
        # for the Studio that started this run: a run failing before its first step removes its folder, and the
        # failure file is where its reason survives (hone.core.train.child_run reads it first)
        failure = HoneError(last.reason, last.advice)
        failure.code = last.code
        record_failure(failure)
        return stop_signals.EXIT_STOPPED_BY_SYSTEM if last.interrupted else 1
    if requests.exit_code is not None and isinstance(last, RunFinished) and last.stopped:
        hint = stop_signals.RESUME_HINT.format(run_dir=last.run_dir)
        print(f"hone: stopped as the system asked, and saved; {hint}", file=sys.stderr)
        return requests.exit_code
    return 0


def score_checkpoints_after(trainer) -> None:
    """train.eval_checkpoints: the run's checkpoints and the base scored once it has ended, with the model it
    trained, as `hone eval RUN --checkpoints all` would; a failure is said, and the run stays finished."""
    from rich.console import Console

    from hone.core.api import DEFAULT_METRIC, score_trained_checkpoints
    from hone.core.cli.commands.eval import Phases, print_table

    console = Console(stderr=True)
    run_dir = trainer.writer.run_dir
    try:
        with Phases(console) as phases:
            table = score_trained_checkpoints(trainer, progress=phases.update)
    except HoneError as e:
        console.print(
            f"hone: the checkpoints were not scored: {e.message}; {e.advice} "
            f"(then `hone eval {run_dir} --checkpoints all`)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return
    for line in [*table.skipped, *table.notes]:
        console.print(f"hone: {line}", highlight=False, markup=False, soft_wrap=True)
    print_table(run_dir, table, table.checkpoints, table.best(DEFAULT_METRIC), DEFAULT_METRIC)
    console.print(f"scores stored in {run_dir / 'scores.json'}", highlight=False, soft_wrap=True)


class RerunCheck:
    """A printer in front of the real one for `--rerun`: after the new run's first step it says (on screen and in
    train.log) whether the first-step loss matches the original run's and which recorded facts differ."""

    def __init__(self, printer, original: str, trainer):
        from hone.core.api.provenance import first_step_loss

        self.printer, self.original, self.trainer = printer, Path(original), trainer
        self.loss, self.why = first_step_loss(self.original)  # before the new run writes anything
        self.run_dir: Path | None = None
        self.done = False

    @property
    def last(self):
        return self.printer.last

    def handle(self, event) -> None:
        from hone.core.events import Notice, RunStarted, StepMetrics

        self.printer.handle(event)
        if isinstance(event, RunStarted):
            self.run_dir = Path(event.run_dir)
        if self.done or not isinstance(event, StepMetrics) or self.run_dir is None:
            return
        from hone.core.api.provenance import rerun_report

        self.done = True
        matches, lines = rerun_report(self.original, self.loss, self.why, self.run_dir, event.loss)
        for line in lines:
            self.printer.handle(Notice("rerun", line, level="info" if matches else "warning"))
            if self.trainer.writer is not None:
                self.trainer.writer.log(f"rerun of {self.original}: {line}")

"""Metrics sent beyond the run folder when `output.report_to` asks: TensorBoard (a `tensorboard/` folder in the run
folder) and Weights & Biases. Off by default; nothing leaves the machine unless "wandb" is asked for. Each reporter
gets the run's step and eval metrics as they come; a missing package is said before the model loads."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
from pathlib import Path

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import HoneError

GIB = 2**30
TENSORBOARD_DIR = "tensorboard"
# reporter -> (the package it needs, how to get it)
NEEDS = {
    "tensorboard": ("tensorboard", 'pip install "hone-studio[tensorboard]" (or pip install tensorboard)'),
    "wandb": ("wandb", "pip install wandb, then wandb login"),
}


def _missing(name: str) -> HoneError:
    return HoneError(
        f"output.report_to asks for {name}, which is not installed",
        f"{NEEDS[name][1]}; or take {name} out of output.report_to",
    )


def check_reporters(config: RunConfig) -> None:
    """Before anything loads: HoneError when a reporter's package is not installed."""
    for name in config.output.report_to:
        if importlib.util.find_spec(NEEDS[name][0]) is None:
            raise _missing(name)


def step_scalars(event: events.StepMetrics) -> dict[str, float]:
    """What a step reports, by the names both reporters use."""
    return {
        "train/loss": event.loss,
        "train/lr": event.lr,
        "train/grad_norm": event.grad_norm,
        "train/tokens_per_s": event.tokens_per_s,
        "train/epoch": event.epoch,
        "memory/allocated_gib": event.mem_allocated / GIB,
        "memory/reserved_gib": event.mem_reserved / GIB,
    }


class TensorBoardReporter:
    """Scalars into RUN/tensorboard; a resumed run drops what the earlier attempt logged after its checkpoint."""

    def __init__(self, run_dir: Path, resumed_from: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard") from None
        self.writer = SummaryWriter(
            log_dir=str(Path(run_dir) / TENSORBOARD_DIR), purge_step=resumed_from + 1 if resumed_from else None
        )

    def report(self, event: events.Event) -> None:
        if isinstance(event, events.StepMetrics):
            for name, value in step_scalars(event).items():
                self.writer.add_scalar(name, value, event.step)
        elif isinstance(event, events.EvalMetrics):
            self.writer.add_scalar("eval/loss", event.loss, event.step)

    def close(self) -> None:
        self.writer.close()


class WandbReporter:
    """One W&B run per run folder (a resumed run continues it), named after the folder, with the run config."""

    def __init__(self, run_dir: Path, config: RunConfig):
        try:
            import wandb
        except ImportError:
            raise _missing("wandb") from None
        run_dir = Path(run_dir)
        run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]  # the same folder, the same run
        self.wandb = wandb
        self.run = wandb.init(
            project="hone", name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=config.to_dict()
        )

    def report(self, event: events.Event) -> None:
        if isinstance(event, events.StepMetrics):
            self.run.log(step_scalars(event), step=event.step)
        elif isinstance(event, events.EvalMetrics):
            self.run.log({"eval/loss": event.loss}, step=event.step)

    def close(self) -> None:
        self.run.finish()


def open_reporters(config: RunConfig, run_dir: Path, resumed_from: int) -> list:
    """The reporters `output.report_to` names, opened.

    Raises:
        HoneError: one of them is not installed (nothing opened stays open).
    """
    opened = []
    try:
        for name in config.output.report_to:
            opened.append(
                TensorBoardReporter(run_dir, resumed_from) if name == "tensorboard" else WandbReporter(run_dir, config)
            )
    except BaseException:
        close_reporters(opened)
        raise
    return opened


def close_reporters(reporters: list) -> None:
    for reporter in reporters:
        with contextlib.suppress(Exception):  # a reporter that cannot flush must not fail a run that trained
            reporter.close()

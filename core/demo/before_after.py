"""What every bundled demo shares: the demo's base config (resources/configs/demo.toml), the phase a scoring reports
through, and "train, then load the adapter onto the base model and score it again"."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Generator
from typing import Protocol

from hone.core.config import RunConfig
from hone.core.resources import resource_path

DEMO_CONFIG = "configs/demo.toml"

__all__ = ["DEMO_CONFIG", "ScorePhase", "SilentPhase", "base_demo_config", "train_and_rescore"]


def base_demo_config(runs_dir: str | None = None, steps: int | None = None, model: str | None = None) -> RunConfig:
    """The bundled demo config (the SFT demo's), optionally with another runs folder, step count or model."""
    config = RunConfig.load(resource_path(DEMO_CONFIG))
    overrides = []
    if runs_dir:
        overrides.append(f"output.runs_dir={json.dumps(runs_dir)}")
    if steps:
        overrides.append(f"train.max_steps={steps}")
    if model:
        overrides.append(f"model.name_or_path={json.dumps(model)}")
    return config.with_overrides(overrides) if overrides else config


class ScorePhase(Protocol):
    """What `run_demo` reports scoring through: `phase(text, total)` is a context manager whose `update(done)`
    takes the rows scored so far (hone.core.cli.console.Phase is one)."""

    def __call__(self, text: str, total: int) -> contextlib.AbstractContextManager: ...


class SilentPhase:
    """A ScorePhase that shows nothing (a demo run from code, not from the command line)."""

    def __init__(self, text: str, total: int):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def update(self, done: int) -> None:
        pass


def train_and_rescore(config: RunConfig, base_model, score: Callable, stage: Callable[[str], None]) -> Generator:
    """Train as `config` says, yielding the run's events; then load the adapter onto `base_model` and score it.
    Returns (RunFinished, score of the fine-tuned model), or None when the run did not finish."""
    from peft import PeftModel

    from hone.core.events import RunFailed, RunFinished
    from hone.core.train.trainer import Trainer

    final = None
    for event in Trainer(config).run():
        yield event
        if isinstance(event, (RunFinished, RunFailed)):
            final = event
    if not isinstance(final, RunFinished):
        return None
    stage("loading the adapter onto the base model")
    return final, score(PeftModel.from_pretrained(base_model, final.adapter_dir))

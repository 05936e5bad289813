"""Training methods by name: `build_objective` gives the trainer its objective; a method registers in one line."""

from __future__ import annotations

from collections.abc import Callable

from hone.core.config import RunConfig
from hone.core.errors import ConfigError
from hone.core.train.objectives.base import Objective
from hone.core.train.objectives.grpo import GroupRelativePolicyOptimization
from hone.core.train.objectives.kto import KahnemanTverskyOptimization
from hone.core.train.objectives.preference import (
    DirectPreferenceOptimization,
    OddsRatioPreferenceOptimization,
    SimplePreferenceOptimization,
)
from hone.core.train.objectives.sft import SupervisedFineTuning

OBJECTIVES: dict[str, Callable[[RunConfig], Objective]] = {
    method.name: method
    for method in (
        SupervisedFineTuning,
        DirectPreferenceOptimization,
        SimplePreferenceOptimization,
        OddsRatioPreferenceOptimization,
        KahnemanTverskyOptimization,
        GroupRelativePolicyOptimization,
    )
}


def build_objective(name: str, config: RunConfig) -> Objective:
    """The objective `name` set up for `config`'s run."""
    make = OBJECTIVES.get(name)
    if make is None:
        raise ConfigError(f"unknown training method {name!r}", f"choose one of {', '.join(sorted(OBJECTIVES))}")
    return make(config)

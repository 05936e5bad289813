"""Training objectives: what a run minimizes, on which rows, and what it adds to each step's metrics.

The trainer's loop does not know which method runs: it asks the run's `Objective` for its data, the summed loss of
a micro-batch, the units that loss is summed over, and the step's extra metrics. A new method is a module here
with a class that meets `Objective` (base.py) and a line in `OBJECTIVES`; docs/architecture.md has the recipe.

    base.py                the `Objective` protocol
    sft.py                 supervised fine-tuning: next-token cross-entropy on the trained tokens
    preference.py          DPO and SimPO on pairs of a chosen and a rejected answer
    preference_losses.py   their per-pair losses and rewards, from the answers' log-probabilities
    logprobs.py            per-sequence log-probabilities of the trained tokens, through the chunked head
"""

from hone.core.train.objectives.base import Objective
from hone.core.train.objectives.preference import DirectPreferenceOptimization, SimplePreferenceOptimization
from hone.core.train.objectives.registry import OBJECTIVES, build_objective
from hone.core.train.objectives.sft import SupervisedFineTuning

__all__ = [
    "OBJECTIVES",
    "DirectPreferenceOptimization",
    "Objective",
    "SimplePreferenceOptimization",
    "SupervisedFineTuning",
    "build_objective",
]

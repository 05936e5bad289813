"""Training objectives: what a run minimizes, on which rows, and what it adds to each step's metrics.

The trainer's loop does not know which method runs: it asks the run's `Objective` for its data, the summed loss of
a micro-batch, the units that loss is summed over, and the step's extra metrics. A new method is a module here
with a class that meets `Objective` (base.py) and a line in `OBJECTIVES`; docs/architecture.md has the recipe.

    base.py                the `Objective` protocol, and `ObjectiveSetup`: what a method's step before step 1 reads
    sft.py                 supervised fine-tuning: next-token cross-entropy on the trained tokens
    preference.py          DPO, SimPO and ORPO on pairs of a chosen and a rejected answer
    kto.py                 KTO on single answers labelled desirable or undesirable, with its KL reference point
    preference_losses.py   their losses and rewards, from the answers' log-probabilities
    grpo.py                GRPO: rewards on answers the policy samples (grpo_rollout.py), grpo_losses.py
    logprobs.py            per-sequence log-probabilities of the trained tokens, through the chunked head
    reference_logprobs.py  the reference's log-probabilities of DPO and KTO, computed once before step 1 and cached
"""

from hone.core.train.objectives.base import Objective, ObjectiveSetup
from hone.core.train.objectives.kto import KahnemanTverskyOptimization
from hone.core.train.objectives.preference import (
    DirectPreferenceOptimization,
    OddsRatioPreferenceOptimization,
    SimplePreferenceOptimization,
)
from hone.core.train.objectives.registry import OBJECTIVES, build_objective
from hone.core.train.objectives.sft import SupervisedFineTuning

__all__ = [
    "OBJECTIVES",
    "DirectPreferenceOptimization",
    "KahnemanTverskyOptimization",
    "Objective",
    "ObjectiveSetup",
    "OddsRatioPreferenceOptimization",
    "SimplePreferenceOptimization",
    "SupervisedFineTuning",
    "build_objective",
]

"""Training objectives: what a run minimizes, on which rows, and what it adds to each step's metrics.

The trainer's loop does not know which method runs: it asks the run's `Objective` for its data, the summed loss of
a micro-batch, the units that loss is summed over, and the step's extra metrics. A new method is a module here
with a class that meets `Objective` (base.py) and a line in `OBJECTIVES`; docs/architecture.md has the recipe.

    base.py   the `Objective` protocol
    sft.py    supervised fine-tuning: next-token cross-entropy on the trained tokens
"""

from hone.core.train.objectives.base import Objective
from hone.core.train.objectives.registry import OBJECTIVES, build_objective
from hone.core.train.objectives.sft import SupervisedFineTuning

__all__ = ["OBJECTIVES", "Objective", "SupervisedFineTuning", "build_objective"]

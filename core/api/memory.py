"""Plan a run's memory: the memory planner's prediction of a step's peak and its fit to the memory there is
(`plan_run`), against the first GPU's free memory (`detect_memory`) or a size given in words (`parse_size`), and the
host memory its offloaded parts hold (`estimate_host`).

Arithmetic on the model's config.json: no torch.
"""

from __future__ import annotations

from hone.core.memory.estimate import GIB, estimate_host
from hone.core.memory.run_plan import Memory, detect_memory, parse_size, plan_run

__all__ = ["GIB", "Memory", "detect_memory", "estimate_host", "parse_size", "plan_run"]

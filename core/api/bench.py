"""`hone bench`'s internals, for the CLI alone (the Studio has no benchmark page; it measures only the MoE
backends, `measure_model_backends`, which hone.core.api re-exports): the scenarios and variants, the text and vision
runners, the scaling measurement over processes, and the reports and profiles they print.

Light to import: the runners, reports and profiles load torch when first used.
"""

from __future__ import annotations

import importlib

from hone.core.bench.scaling import check_processes, efficiency, run_scaling
from hone.core.bench.scenarios import SCENARIOS, get_scenario
from hone.core.bench.variants import VARIANTS

# Names whose engine module imports torch: resolved on first use.
_LAZY = {
    "BenchOptions": "hone.core.bench.run",
    "run_bench": "hone.core.bench.run",
    "BASELINE": "hone.core.bench.vision",
    "HONE_RUNS": "hone.core.bench.vision",
    "VisionOptions": "hone.core.bench.vision",
    "run_vision_bench": "hone.core.bench.vision",
    "PREFERENCE_BASELINE": "hone.core.bench.preference",
    "run_preference_bench": "hone.core.bench.preference",
    "run_sampling_bench": "hone.core.bench.sampling",
    "StepRun": "hone.core.bench.grpo_steps",
    "notes": "hone.core.bench.report",
    "ratio_table": "hone.core.bench.report",
    "write_json": "hone.core.bench.report",
    "memory_lines": "hone.core.bench.diagnostics.memory_trace",
    "host_profile_lines": "hone.core.bench.diagnostics.host_profile",
    "profile_tables": "hone.core.bench.diagnostics.profile",
    "measure_model_backends": "hone.core.bench.moe_backends",
    "run_max_length": "hone.core.bench.max_length",
    "max_length_table": "hone.core.bench.max_length",
}

__all__ = ["SCENARIOS", "VARIANTS", "check_processes", "efficiency", "get_scenario", "run_scaling", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

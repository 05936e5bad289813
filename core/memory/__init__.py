"""The memory planner: predict a training step's peak GPU memory from the model's config and the run's settings,
and fit a run into the memory a GPU has (`hone plan`, the Train page's estimate).

    ModelShape.from_config(hf_config) / load_model_config(...)   sizes, from config.json or GGUF metadata
    estimate_peak(shape, MemorySettings) -> MemoryEstimate       the peak, by part
    auto_fit(shape, settings, available_bytes, longest_row)      cheapest levers and largest batch that fit
    plan_run(run_config, Memory) -> RunPlan                      all of it for one run

Arithmetic only (no GPU): the trainer's own policy module is asked how `auto` resolves the checkpoint mode.
"""

from hone.core.memory.estimate import GIB, MemoryEstimate, MemorySettings, estimate_peak
from hone.core.memory.fit import FitResult, auto_fit
from hone.core.memory.shape import ModelShape, load_model_config

__all__ = [
    "GIB",
    "FitResult",
    "MemoryEstimate",
    "MemorySettings",
    "ModelShape",
    "auto_fit",
    "estimate_peak",
    "load_model_config",
]

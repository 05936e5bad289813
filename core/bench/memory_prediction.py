"""The memory planner's prediction for a `hone bench` run, from the run's JSON record: what
tools/memory_calibration.py compares with the peak the run measured."""

from __future__ import annotations

from hone.core.memory.estimate import MemoryEstimate, estimate_peak
from hone.core.memory.run_plan import settings_from_config
from hone.core.memory.shape import ModelShape


def predict_bench_run(report: dict, run_name: str) -> MemoryEstimate:
    """The predicted peak of one run of a `hone bench --json` report: its scenario, options, batch and variant (a
    --run run's settings come from the report's options), with `auto` resolved as the Trainer's plan resolves it
    (settings_from_config: CUDA graphs keep the layer inputs on the GPU) and what all-spare chose from the GPU's free
    memory (whole MLPs, kept layers) taken from the run's record."""
    from hone.core.bench.hone_runner import bench_run_config
    from hone.core.bench.scenarios import get_scenario
    from hone.core.bench.variants import bench_variants
    from hone.core.models.shapes import make_config

    options = report["options"]
    scenario = get_scenario(options["scenario"])
    hf_config = make_config(scenario.shape, options.get("layers") or scenario.layers)
    variant = next(v for v in bench_variants(options.get("extra_runs")) if v.name == run_name)
    batch = report["batch"]
    run = next((r for r in report.get("runs", []) if r.get("name") == run_name), {})
    config = bench_run_config(
        variant,
        batch["tokens"],
        lora_r=options.get("lora_r", 16),
        dtype_name=report.get("dtype", "bfloat16"),
        qlora=bool(options.get("qlora")),
        lora_experts=options.get("lora_experts", True),
    ).with_overrides(run.get("spare") or [])
    mean_row = batch["tokens"] / max(batch["sequences"], 1)
    settings, _ = settings_from_config(config, hf_config, cuda=True, mean_row_tokens=mean_row)
    return estimate_peak(ModelShape.from_config(hf_config, scenario.shape), settings)

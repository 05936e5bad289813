"""The memory planner's prediction for a `hone bench` run, from the run's JSON record: what
tools/memory_calibration.py compares with the peak the run measured."""

from __future__ import annotations

from hone.core.memory.estimate import MemoryEstimate, MemorySettings, estimate_peak
from hone.core.memory.run_plan import resolve_checkpoint
from hone.core.memory.shape import ModelShape


def predict_bench_run(report: dict, run_name: str) -> MemoryEstimate:
    """The predicted peak of one run of a `hone bench --json` report (its scenario, options, batch and variant; a
    --run run's settings come from the report's options; the layers that kept their activations and whether the
    MLPs were tiled, from what the run recorded)."""
    from hone.core.bench.scenarios import get_scenario
    from hone.core.bench.variants import bench_variants, speed_settings
    from hone.core.models.shapes import make_config

    options = report["options"]
    scenario = get_scenario(options["scenario"])
    config = make_config(scenario.shape, options.get("layers") or scenario.layers)
    variant = next(v for v in bench_variants(options.get("extra_runs")) if v.name == run_name)
    speed = speed_settings(variant)
    batch = report["batch"]
    mean_row = batch["tokens"] / max(batch["sequences"], 1)
    run = next((r for r in report.get("runs", []) if r.get("name") == run_name), {})
    # all-spare decides both from the GPU's free memory: its record says what it chose
    untiled = "speed.tiled_mlp=false" in (run.get("spare") or [])
    return estimate_peak(
        ModelShape.from_config(config, scenario.shape),
        MemorySettings(
            batch_tokens=batch["tokens"],
            lora_rank=options.get("lora_r", 16),
            qlora=bool(options.get("qlora")),
            optimizer=variant.train.get("optimizer", "adamw"),
            weight_bytes=4 if report.get("dtype") == "float32" else 2,
            checkpoint=resolve_checkpoint(speed.get("checkpoint", "auto"), mean_row, config, cuda=True),
            host_embeddings=speed.get("host_embeddings", True),
            host_lm_head=speed.get("host_lm_head", True),
            tiled_mlp=speed.get("tiled_mlp", True) and speed.get("kernels", True) and not untiled,
            projection_recompute=not speed.get("compile", False),
            chunked_loss=speed.get("loss", "chunked") == "chunked",
            kernels=speed.get("kernels", True),
            kept_layers=int(run.get("kept_layers") or 0),
        ),
    )

"""The Studio's heavy one-off jobs, as plain functions the helper process runs (hone.app.helper_process): exporting
a run, reading a model's details, planning a run's memory. Free of Qt, so that the helper imports only these and
the engine."""

from __future__ import annotations

from typing import Any

from hone.core.config import RunConfig


def run_export(
    run_dir: str, fmt: str, out: str, force: bool, progress, checkpoint: int | None = None, scores: dict | None = None
) -> Any:
    """Export a run (its final adapter, or with `checkpoint` a saved checkpoint's, whose stored `scores` go into the
    model card); core's progress(stage, fraction) reports go to `progress` as (stage, fraction)."""
    from hone.core.api import export_run

    return export_run(
        run_dir,
        fmt,
        out or None,
        force=force,
        progress=lambda stage, fraction: progress((stage, fraction)),
        checkpoint=checkpoint,
        scores=scores,
    )


def read_model(name_or_path: str) -> Any:
    """A model's details from its config (no weights): where torch first loads."""
    from hone.core.api import inspect_model

    return inspect_model(name_or_path)


def plan_memory(config: RunConfig, memory: Any = None) -> Any:
    """The run's memory plan against `memory` (a Memory), or against what this machine has free when None."""
    from hone.core.api import detect_memory, plan_run

    return plan_run(config, memory if memory is not None else detect_memory(), allow_qlora=True)

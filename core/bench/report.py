"""Ratios against the baseline run, the rich table, the environment record, and the JSON file.

Ratios: tokens/s of a run / tokens/s of the baseline (higher is faster), peak allocated memory of a run / the
baseline's (lower is leaner). Parity: the run's first-step loss against the baseline's (the same weights and
batch, before any update) within a per-dtype relative tolerance, and the first step's gradient norm within a
looser one (it goes through the whole backward pass, so it catches a wrong gradient the loss cannot show).
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from hone.core.bench.measure import RunResult

# Relative tolerances by dtype: (first-step loss, first-step gradient norm). fp32 paths differ by summation order
# only; bf16 / fp16 paths round every matmul and attention output differently along 28-36 layers. On the H200
# every correct bf16 path stayed within 6e-5 (loss) and 7e-4 (gradient norm) of the reference, while a broken
# checkpoint reload moved the gradient norm by 2%: the bf16 bounds sit well above the first and below the second.
PARITY_TOLERANCE = {
    "float32": (1e-4, 1e-3),
    "bfloat16": (1e-3, 1e-2),
    "float16": (1e-3, 1e-2),
}
_VERSIONED_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "triton",
    "bitsandbytes",
    "flash-attn",
    "unsloth",
    "numpy",
)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(
    runs: list[RunResult], baseline: str, dtype: str, also: tuple[str, ...] = (), *, parity: bool = True
) -> None:
    """Fill each run's ratios, loss difference and parity against the run named `baseline` (in place), and its
    tokens/s ratio against each run named in `also` that ran (`speed_ratios`). `parity=False` when the runs do not
    train the same batch (the vision scenario: packed vs padded rows): the loss difference is filled, parity not."""
    for name in also:
        other = next((r for r in runs if r.name == name and r.ok and r.tokens_per_s), None)
        if other is None or name == baseline:
            continue
        for run in runs:
            if run.ok and run.tokens_per_s:
                run.speed_ratios[name] = run.tokens_per_s / other.tokens_per_s
    base = next((r for r in runs if r.name == baseline), None)
    loss_tol, grad_tol = PARITY_TOLERANCE.get(dtype, PARITY_TOLERANCE["bfloat16"])
    for run in runs:
        if base is None or not base.ok:
            continue
        if run.ok and base.tokens_per_s:
            run.speed_ratio = run.tokens_per_s / base.tokens_per_s
        if run.ok and run.peak_allocated_gib and base.peak_allocated_gib:
            run.memory_ratio = run.peak_allocated_gib / base.peak_allocated_gib
        if run.first_loss is None or base.first_loss is None:
            continue
        run.loss_diff = run.first_loss - base.first_loss
        run.loss_rel_diff = _rel(run.first_loss, base.first_loss)
        if not parity:
            continue
        same = run.loss_rel_diff <= loss_tol
        # The peer initializes LoRA A with its own random draws, so only its loss is comparable.
        if run.first_grad_norm is not None and base.first_grad_norm is not None and run.kind != "peer":
            run.grad_norm_rel_diff = _rel(run.first_grad_norm, base.first_grad_norm)
            same = same and run.grad_norm_rel_diff <= grad_tol
        run.parity = bool(same) and all(math.isfinite(x) for x in (run.first_loss, base.first_loss))
        if run.trainable_params and base.trainable_params and run.trainable_params != base.trainable_params:
            # Equal first losses say nothing then: LoRA B starts at zero, so any trainable set gives the same loss.
            run.parity = False
            run.parity_reason = (
                f"trains {run.trainable_params:,} parameters, {baseline} {base.trainable_params:,}: "
                f"not the same run{_adapted_difference(run, base, baseline)}"
            )


def _adapted_difference(run, base, baseline: str) -> str:
    """ "; LoRA only in reference on: q_a_proj, …" from the runs' `adapted` speed paths, when both have one."""
    mine, theirs = ((r.speed_paths or {}).get("adapted") for r in (run, base))
    if mine is None or theirs is None:
        return ""
    mine, theirs = set(filter(None, mine.split(", "))), set(filter(None, theirs.split(", ")))
    parts = [
        f"LoRA only in {who} on: {', '.join(sorted(names))}"
        for who, names in ((baseline, theirs - mine), (run.name, mine - theirs))
        if names
    ]
    return "; " + "; ".join(parts) if parts else ""


# ---- environment --------------------------------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML library or no driver: try the command line tool
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _git_commit() -> str | None:
    folder = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict:
    """Machine, GPU, driver and package versions, for the JSON record."""
    import torch

    from hone.core.version import __version__

    env = {
        "hone": __version__,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "cuda_runtime": torch.version.cuda,
        "packages": {p: _version(p) for p in _VERSIONED_PACKAGES},
    }
    if str(device).startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(
            gpu=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            driver=_driver_version(),
            cudnn=torch.backends.cudnn.version(),
        )
    return env


# ---- JSON ---------------------------------------------------------------------------------------------------------


def _finite(value):
    """JSON has no NaN / inf: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(data: dict, path: str | Path) -> Path:
    """Write the benchmark record (atomically: a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# ---- the table ----------------------------------------------------------------------------------------------------


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _count(value: int | None) -> str:
    """43_646_976 -> "43.6M"."""
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return str(value)


def ratio_table(runs: list[RunResult], baseline: str, title: str):
    """A rich Table: one row per run, ratios against `baseline`."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    others = sorted({name for run in runs for name in run.speed_ratios})
    for header, justify in (
        ("run", "left"),
        ("status", "left"),
        ("tokens/s", "right"),
        ("x speed", "right"),
        *((f"x {name.removeprefix('reference-')}", "right") for name in others),
        ("trainable", "right"),
        ("peak GiB", "right"),
        ("x memory", "right"),
        ("reserved", "right"),
        ("MFU", "right"),
        ("loss", "right"),
        ("Δ loss", "right"),
        ("parity", "center"),
        ("syncs", "right"),
    ):
        table.add_column(header, justify=justify)
    for run in runs:
        status = {
            "ok": "[green]ok[/green]",
            "oom": "[red]OOM[/red]",
            "failed": "[red]failed[/red]",
            "skipped": "[dim]skipped[/dim]",
        }[run.status]
        parity = {None: "-", True: "[green]yes[/green]", False: "[red]NO[/red]"}[run.parity]
        name = f"[bold]{run.name}[/bold]" if run.name == baseline else run.name
        table.add_row(
            name,
            status,
            _num(run.tokens_per_s, ",.0f"),
            _num(run.speed_ratio, ".2f"),
            *(_num(run.speed_ratios.get(other), ".2f") for other in others),
            _count(run.trainable_params),
            _num(run.peak_allocated_gib, ".2f"),
            _num(run.memory_ratio, ".2f"),
            _num(run.peak_reserved_gib, ".2f"),
            _num(None if run.mfu is None else 100 * run.mfu, ".1f"),
            _num(run.first_loss, ".4f"),
            _num(run.loss_diff, "+.2e"),
            parity,
            _num(run.syncs_fwd_bwd, "d"),
        )
    return table


def notes(runs: list[RunResult]) -> list[str]:
    """One line per run that did not finish, and per run whose parity is no for another reason than its numbers."""
    return [f"{run.name}: {run.status}: {run.reason}" for run in runs if not run.ok] + [
        f"{run.name}: parity no: {run.parity_reason}" for run in runs if run.parity_reason
    ]

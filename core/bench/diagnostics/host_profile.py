"""One training step under Python's `cProfile` (`hone bench --host-profile`): where the host's time goes.

On small models a step is bound by the CPU, not the GPU: the host spends longer issuing kernels (Python, the
modules' code, PyTorch's dispatch) than the GPU spends running them. `torch.profiler` (`--profile`) shows the
kernels; `host_profile_step` shows the host side, by function and by package, and how long it waited for the GPU.
"""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
import time
from collections import defaultdict
from pathlib import Path

import torch

# Calls that wait for the GPU: their time is the device catching up with the host.
_WAITS = (
    "method 'item'",
    "method 'synchronize'",
    "built-in method torch._C._cuda_synchronize",
    "method 'tolist'",
    "method 'cpu'",
)
_PACKAGES = ("hone", "torch", "transformers", "peft", "triton", "bitsandbytes")


def _hone_folders() -> dict[str, str]:
    """Folder of each of Hone's packages -> its label prefix; an editable install maps hone.core onto core/."""
    folders = {}
    for sub in ("app", "core", "kernels"):
        spec = importlib.util.find_spec(f"hone.{sub}")
        for location in (spec.submodule_search_locations or []) if spec else []:
            folders[str(Path(location).resolve()).replace("\\", "/") + "/"] = f"hone/{sub}/"
    return folders


_HONE_FOLDERS = _hone_folders()


def _synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def _locate(filename: str) -> tuple[str, str]:
    """(package, path from the package's folder on) of a profiled function's file: ("builtins", "") for C calls,
    ("hone", "hone/core/train/loss.py") for Hone's own, ("other", the file's name) outside `_PACKAGES`."""
    if filename == "~" or filename.startswith("<built-in"):
        return "builtins", ""
    path = filename.replace("\\", "/")
    for folder, prefix in _HONE_FOLDERS.items():  # an editable install's folders need not be named "hone"
        if path.startswith(folder):
            return "hone", prefix + path[len(folder) :]
    parts = path.split("/")
    for index in range(len(parts) - 2, -1, -1):  # the innermost package folder holding the file
        if parts[index] in _PACKAGES:
            return parts[index], "/".join(parts[index:])
    return "other", parts[-1]


def package_of(filename: str) -> str:
    """The package a profiled function belongs to: one of `_PACKAGES`, "builtins" for C calls, else "other"."""
    return _locate(filename)[0]


def summarize(stats: pstats.Stats, wall_s: float, top: int) -> dict:
    """The summary of a finished profile (see `host_profile_step`)."""
    rows, packages, waiting = [], defaultdict(float), 0.0
    for (filename, line, name), (_, calls, self_s, cumulative_s, _) in stats.stats.items():
        package, where = _locate(filename)
        label = f"{where}:{line} {name}" if where else name
        packages[package] += self_s
        if filename == "~" and any(wait in name for wait in _WAITS):
            waiting += self_s
        rows.append({"function": label, "calls": calls, "self_ms": self_s * 1e3, "cumulative_ms": cumulative_s * 1e3})
    rows.sort(key=lambda row: row["self_ms"], reverse=True)
    total_calls = sum(row["calls"] for row in rows)
    return {
        "wall_ms": wall_s * 1e3,
        "waiting_ms": waiting * 1e3,
        "function_calls": total_calls,
        "functions": rows[:top],
        "packages": dict(sorted(((k, v * 1e3) for k, v in packages.items()), key=lambda kv: -kv[1])),
    }


def host_profile_step(runner, device: str, *, top: int = 25) -> dict:
    """Run one more `runner.step()` under cProfile and summarize it (the caller's timed steps stay unprofiled).

    Returns:
        "functions": the `top` functions by their own time ("self"), with calls and cumulative time; "packages":
        self time summed by package (hone, torch, transformers, peft, builtins for C calls); "wall_ms" and
        "waiting_ms". A built-in call's self time is the C++ behind it: for a PyTorch op, the dispatch and the
        kernel launch (or its whole run on the CPU). `waiting_ms` is the time in calls that block until the GPU is
        done (`.item()`, synchronize): large means the GPU was the bottleneck in this step, small means the host
        was. cProfile's own overhead inflates Python-heavy code, so read shares, not absolutes. On a GPU the
        autograd engine runs the backward pass on a thread of its own, which cProfile does not follow: the backward
        shows as one call (`run_backward`) whose self time is the whole pass's host time.
    """
    _synchronize(device)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    try:
        runner.step()
        _synchronize(device)
    finally:
        profiler.disable()
    wall = time.perf_counter() - started
    return summarize(pstats.Stats(profiler), wall, top)


def host_profile_lines(name: str, summary: dict) -> list[str]:
    """Plain lines for the console."""
    if "error" in summary:
        return [f"host profile of {name}: {summary['error']}"]
    packages = ", ".join(f"{k} {v:.1f} ms" for k, v in summary["packages"].items())
    lines = [
        f"host profile of {name}: one step {summary['wall_ms']:.1f} ms wall under cProfile, "
        f"{summary['waiting_ms']:.1f} ms of it waiting for the GPU, {summary['function_calls']:,} calls; "
        f"self time by package: {packages}",
        f"{'self ms':>9} {'cum ms':>9} {'calls':>8}  function",
    ]
    for row in summary["functions"]:
        lines.append(f"{row['self_ms']:9.1f} {row['cumulative_ms']:9.1f} {row['calls']:8,}  {row['function']}")
    return lines

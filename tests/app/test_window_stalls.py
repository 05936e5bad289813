"""The window never stalls on the Studio's heavy one-off jobs: reading a model, the memory estimate, the data check and
exports run in the helper process, so the GUI thread's longest pause stays under 100 ms in each (issue bar, on 2
cores) and torch is never imported in the window's process. Measured in a process of its own (window_stall_probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6", reason="the Studio's tests need PySide6")

PROBE = Path(__file__).with_name("window_stall_probe.py")
STALL_BOUND_MS = 100


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from tests.core.export.export_helpers import tiny_dense_run

    root = tmp_path_factory.mktemp("stalls")
    return tiny_dense_run(root), root / "base"


def _probe(run_dir: Path, base: Path, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, str(PROBE), str(run_dir), str(base), str(folder / "settings.ini"), str(folder / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _phases(found: dict) -> dict[str, dict]:
    return {name: value for name, value in found.items() if isinstance(value, dict)}


def test_heavy_jobs_run_in_the_helper_and_never_stall_the_window(tiny_run, tmp_path):
    run_dir, base = tiny_run
    found = _probe(run_dir, base, tmp_path / "first")
    print(f"\n{found}")
    assert found["model ok"] and found["data ok"], found
    phases = _phases(found)
    assert set(phases) == {
        "read model",
        "memory estimate",
        "data check",
        "export adapter",
        "export merged:bf16",
        "export gguf:q8_0",
    }
    for name, phase in phases.items():
        assert phase["finished"], name
        assert phase.get("passed", True), f"{name}: the export's read-back checks failed"
    assert not found["torch_in_window"], "torch was imported in the window's process"
    # A pause is the window's own work or the GIL, or another process holding both cores (the rest of a test suite
    # on a 2-core machine). A phase over the bound is measured once more; a window that stalls pauses both times.
    over = [name for name, phase in phases.items() if phase["longest_gap_ms"] >= STALL_BOUND_MS]
    if over:
        again = _phases(_probe(run_dir, base, tmp_path / "again"))
        print(f"measured again: {again}")
        for name in over:
            assert again[name]["finished"], name
            gaps = (phases[name]["longest_gap_ms"], again[name]["longest_gap_ms"])
            assert min(gaps) < STALL_BOUND_MS, f"{name}: the window paused {gaps[0]} ms, then {gaps[1]} ms"

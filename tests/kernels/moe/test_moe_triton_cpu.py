"""Runs the Triton MoE tests on the CPU under Triton's interpreter, in a subprocess.

TRITON_INTERPRET must be set before the kernels are defined, and other tests in this process may already have
imported them for the GPU, so the interpreted run gets its own process. It selects the tests whose id contains
"interpreter".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.triton_interpreter import interpreter_fault

ROOT = Path(__file__).resolve().parents[3]
FILES = [
    "tests/kernels/moe/test_grouped_gemm.py",
    "tests/kernels/moe/test_moe_experts.py",
    "tests/core/speed/moe/test_moe_module_backends.py",
]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="already inside the interpreted run")
def test_triton_kernels_pass_under_the_cpu_interpreter():
    pytest.importorskip("triton")
    if fault := interpreter_fault():
        pytest.skip(fault)
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not gpu",
            "-k",
            "interpreter",
            "-rs",
            *FILES,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"interpreted Triton tests failed:\n{tail}"
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, f"expected every selected test to run: {summary}"

"""The install plan over a table of machines: which PyTorch build, or why nothing can be installed."""

from __future__ import annotations

import pytest

from hone.core.install.machine import Gpu, Machine
from hone.core.install.plan import TESTED_TORCH_CPU, TESTED_TORCH_CUDA, plan_install

RTX_4060_LAPTOP = Gpu("NVIDIA GeForce RTX 4060 Laptop GPU", 8188, (8, 9))
RTX_4090 = Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9))
RTX_5090 = Gpu("NVIDIA GeForce RTX 5090", 32607, (12, 0))
GTX_1080 = Gpu("NVIDIA GeForce GTX 1080", 8192, (6, 1))
GB10 = Gpu("NVIDIA GB10", None, (12, 1))

# name -> (machine, expected build, expected torch, a phrase the error must contain or None)
MACHINES = {
    "windows + RTX 4060 laptop, CUDA 12.9 driver": (
        Machine("windows", "x86_64", (RTX_4060_LAPTOP,), "576.02", (12, 9)),
        "cu128",
        TESTED_TORCH_CUDA,
        None,
    ),
    "windows + RTX 4060 laptop, CUDA 13.0 driver": (
        Machine("windows", "x86_64", (RTX_4060_LAPTOP,), "581.57", (13, 0)),
        "cu130",
        TESTED_TORCH_CUDA,
        None,
    ),
    "windows without NVIDIA": (Machine("windows", "x86_64"), "cpu", TESTED_TORCH_CPU, None),
    "ubuntu 24.04 x86_64 + RTX 4090": (
        Machine("linux", "x86_64", (RTX_4090,), "580.95.05", (13, 0), (2, 39)),
        "cu130",
        TESTED_TORCH_CUDA,
        None,
    ),
    "DGX Spark": (
        Machine("linux", "aarch64", (GB10,), "580.95.05", (13, 0), (2, 39)),
        "cu130",
        TESTED_TORCH_CUDA,
        None,
    ),
    "aarch64 with glibc 2.35": (
        Machine("linux", "aarch64", (GB10,), "580.95.05", (13, 0), (2, 35)),
        "cpu",
        TESTED_TORCH_CPU,
        "glibc 2.39",
    ),
    "DGX Spark with a CUDA 12.8 driver": (
        Machine("linux", "aarch64", (GB10,), "570.86", (12, 8), (2, 39)),
        "cpu",
        TESTED_TORCH_CPU,
        "needs CUDA 13.0",
    ),
    "RTX 5090 with a CUDA 12.6 driver": (
        Machine("linux", "x86_64", (RTX_5090,), "560.35", (12, 6), (2, 39)),
        "cpu",
        TESTED_TORCH_CPU,
        "needs CUDA 12.8 (driver 570.26",
    ),
    "GTX 1080 with a CUDA 13.0 driver": (
        Machine("linux", "x86_64", (GTX_1080,), "580.95.05", (13, 0), (2, 35)),
        "cu126",
        TESTED_TORCH_CUDA,
        None,
    ),
    "old x86_64 driver": (
        Machine("windows", "x86_64", (RTX_4090,), "552.22", (12, 4)),
        "cpu",
        TESTED_TORCH_CPU,
        "driver 560.76",
    ),
    "driver without a CUDA version": (
        Machine("linux", "x86_64", (RTX_4090,), "580.95.05", None, (2, 39)),
        "cpu",
        TESTED_TORCH_CPU,
        "does not say which CUDA version",
    ),
    "macOS": (Machine("darwin", "aarch64"), "cpu", TESTED_TORCH_CPU, "macOS"),
    "windows on ARM": (Machine("windows", "aarch64"), "cpu", TESTED_TORCH_CPU, "Windows on x86_64"),
}


@pytest.mark.parametrize("name", list(MACHINES))
def test_plan_for_machine(name):
    machine, build, torch, error = MACHINES[name]
    plan = plan_install(machine)
    assert plan.build == build
    assert plan.torch == f"torch=={torch}"
    if error is None:
        assert plan.error is None
        assert plan.describe().startswith(f"Installing PyTorch {torch}, ")
    else:
        assert error in plan.error
        assert plan.describe().startswith("Cannot install: ")


def test_no_driver_says_how_to_get_the_gpu_build():
    plan = plan_install(Machine("windows", "x86_64"))
    [warning] = [note for note in plan.notes if note.level == "warning"]
    assert "No NVIDIA GPU driver was found" in warning.text
    assert "nvidia.com/drivers" in warning.text and "Repair Hone Studio" in warning.text


def test_unified_memory_is_noted_and_offload_is_ruled_out():
    plan = plan_install(MACHINES["DGX Spark"][0])
    assert any("Unified memory" in note.text and "offload" in note.text for note in plan.notes)
    assert not any(
        "Unified memory" in note.text for note in plan_install(MACHINES["ubuntu 24.04 x86_64 + RTX 4090"][0]).notes
    )


def test_cpu_asked_for_on_a_gpu_machine():
    plan = plan_install(MACHINES["ubuntu 24.04 x86_64 + RTX 4090"][0], cpu=True)
    assert (plan.build, plan.error) == ("cpu", None)
    assert "CPU build" in plan.describe()


def test_a_gpu_too_old_for_every_build_is_refused():
    kepler = Gpu("NVIDIA Tesla K80", 11441, (3, 7))
    plan = plan_install(Machine("linux", "x86_64", (kepler,), "470.256", (12, 8), (2, 35)))
    assert "no CUDA build for NVIDIA Tesla K80 (compute capability 3.7)" in plan.error

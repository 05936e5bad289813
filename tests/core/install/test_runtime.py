"""The first-start check: plain words about PyTorch and the GPU, on the real CPU build and on stand-ins for CUDA
builds (this machine has no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hone.core.install.machine import Gpu, Machine
from hone.core.install.runtime import ERROR, OK, WARNING, check_runtime, has_kernels_for

NO_GPU = Machine("linux", "x86_64", glibc=(2, 39))
RTX_4090 = Machine("linux", "x86_64", (Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9)),), "580.95.05", (13, 0))
DGX_SPARK = Machine("linux", "aarch64", (Gpu("NVIDIA GB10", None, (12, 1)),), "580.95.05", (13, 0), (2, 39))
WINDOWS_OLD_DRIVER = Machine(
    "windows", "x86_64", (Gpu("NVIDIA GeForce RTX 4060 Laptop GPU", 8188, (8, 9)),), "560.94", (12, 6)
)

# torch 2.11.0+cu130's list, as printed on an H200 host.
CU130_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def cuda_torch(built_for="13.0", available=True, arches=CU130_ARCHES, capability=(12, 1), name="NVIDIA GB10"):
    """A stand-in for a CUDA build of torch, answering what check_runtime asks."""

    def init():
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")

    cuda = SimpleNamespace(
        is_available=lambda: available,
        get_arch_list=lambda: arches,
        device_count=lambda: 1,
        get_device_capability=lambda index: capability,
        get_device_name=lambda index: name,
        init=init,
    )
    return SimpleNamespace(
        __version__=f"2.11.0+cu{built_for.replace('.', '')}", version=SimpleNamespace(cuda=built_for), cuda=cuda
    )


def test_the_real_cpu_build_without_a_gpu():
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this check is about the CPU build")
    [finding] = check_runtime(NO_GPU)
    assert finding.level == WARNING and "training runs on the CPU" in finding.title
    assert "run install.sh again" in finding.fix


def test_the_real_cpu_build_on_a_gpu_machine_says_repair():
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this check is about the CPU build")
    [finding] = check_runtime(RTX_4090)
    assert finding.level == WARNING
    assert "is the CPU build, so training will not use the NVIDIA GeForce RTX 4090" in finding.title
    assert "without --cpu" in finding.fix


def test_dgx_spark_ready():
    [finding] = check_runtime(DGX_SPARK, cuda_torch())
    assert finding.level == OK
    assert finding.title.startswith("Ready to train on NVIDIA GB10: PyTorch 2.11.0+cu130 (CUDA 13.0)")


def test_driver_older_than_the_build():
    [finding] = check_runtime(WINDOWS_OLD_DRIVER, cuda_torch("13.0", available=False, capability=(8, 9)))
    assert finding.level == ERROR
    assert "driver 560.94 is too old" in finding.title and "CUDA 12.6" in finding.title
    assert "Repair Hone Studio" in finding.fix


def test_cuda_build_without_a_driver():
    [finding] = check_runtime(NO_GPU, cuda_torch())
    assert finding.level == ERROR and "No NVIDIA driver" in finding.title


def test_gpu_not_usable_gives_torchs_reason():
    [finding] = check_runtime(RTX_4090, cuda_torch(available=False, capability=(8, 9)))
    assert finding.level == ERROR and finding.title == "PyTorch cannot use the GPU."
    assert "CUDA driver initialization failed" in finding.detail


def test_build_without_code_for_the_gpu():
    [finding] = check_runtime(
        RTX_4090, cuda_torch(arches=["sm_90", "sm_100"], capability=(8, 9), name="NVIDIA GeForce RTX 4090")
    )
    assert finding.level == ERROR
    assert "no GPU code for the NVIDIA GeForce RTX 4090 (compute capability 8.9)" in finding.title


@pytest.mark.parametrize(
    ("capability", "arches", "runs"),
    [
        ((12, 1), CU130_ARCHES, True),  # DGX Spark runs sm_120 code
        ((8, 9), CU130_ARCHES, True),  # sm_86 code on an 8.9 GPU
        ((8, 0), ["sm_86", "sm_90"], False),  # a minor above the GPU's does not run
        ((6, 1), CU130_ARCHES, False),  # Pascal: none of the cu130 build
        ((10, 3), ["sm_90", "compute_90"], True),  # PTX is compiled for newer GPUs by the driver
        ((7, 5), ["sm_80", "compute_80"], False),
    ],
)
def test_has_kernels_for(capability, arches, runs):
    assert has_kernels_for(capability, arches) is runs

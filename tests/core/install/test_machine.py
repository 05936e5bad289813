"""Reading the machine: nvidia-smi's output (recorded on real machines), missing drivers, architectures."""

from __future__ import annotations

import subprocess

from hone.core.install.machine import Gpu, normalize_arch, parse_driver_cuda, parse_gpu_query, probe_machine

# Recorded on an H200 host; the GB10 line as DGX Spark's driver prints it (no memory of its own).
H200_QUERY = "NVIDIA H200, 580.159.04, 143771 MiB, 9.0\n"
H200_SUMMARY = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
"""
GB10_QUERY = "NVIDIA GB10, 580.95.05, [N/A], 12.1\n"
TWO_GPUS_QUERY = "NVIDIA GeForce RTX 4090, 570.133.07, 24564 MiB, 8.9\n" * 2


def recorded(query: str, summary: str = H200_SUMMARY):
    def run(command):
        return query if len(command) > 1 else summary

    return run


def test_parses_the_h200():
    gpus, driver = parse_gpu_query(H200_QUERY)
    assert gpus == (Gpu("NVIDIA H200", 143771, (9, 0)),)
    assert driver == "580.159.04"
    assert parse_driver_cuda(H200_SUMMARY) == (13, 0)
    assert not gpus[0].unified_memory


def test_gb10_has_unified_memory():
    machine = probe_machine(recorded(GB10_QUERY))
    assert machine.gpus == (Gpu("NVIDIA GB10", None, (12, 1)),)
    assert machine.unified_memory
    assert "NVIDIA GB10 (unified memory)" in machine.describe()


def test_two_gpus_and_the_driver_cuda_version():
    machine = probe_machine(recorded(TWO_GPUS_QUERY))
    assert len(machine.gpus) == 2 and machine.driver_version == "570.133.07" and machine.driver_cuda == (13, 0)
    assert "24 GiB" in machine.describe()


def test_no_nvidia_smi_means_no_driver():
    def missing(command):
        raise FileNotFoundError("nvidia-smi is not on PATH")

    machine = probe_machine(missing)
    assert machine.gpus == () and not machine.has_nvidia_driver
    assert "no NVIDIA driver" in machine.notes[0] and "no NVIDIA driver" in machine.describe()


def test_nvidia_smi_failing_means_no_driver():
    def failing(command):
        raise subprocess.CalledProcessError(
            9,
            command,
            output="",
            stderr="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        )

    machine = probe_machine(failing)
    assert not machine.has_nvidia_driver
    assert "exit 9: NVIDIA-SMI has failed" in machine.notes[0]


def test_architectures_are_spelled_the_linux_way():
    assert [normalize_arch(name) for name in ("AMD64", "x86_64", "ARM64", "aarch64")] == [
        "x86_64",
        "x86_64",
        "aarch64",
        "aarch64",
    ]


def test_this_machine_reads_without_raising():
    machine = probe_machine()
    assert machine.system in ("linux", "windows", "darwin")
    assert machine.describe().startswith(machine.system)

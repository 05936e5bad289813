"""GPU telemetry: NVML readings with unit conversion, and the system-memory fallbacks the Monitor relies on."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

from hone.core.machine.telemetry import GPU, SYSTEM, UNIFIED, Telemetry, system_memory


class NotSupported(Exception):
    """What pynvml raises for a query the device does not support."""


class FakeNvml:
    """The slice of the NVML API Telemetry reads, answering with fixed numbers (a test double for a driver)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, memory=None, fail_init: Exception | None = None, devices=("NVIDIA Test GPU",)):
        self.memory = memory
        self.fail_init = fail_init
        self.devices = devices
        self.asked_index = None
        self.shut_down = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetHandleByIndex(self, index):
        self.asked_index = index
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return ("handle", uuid)

    def nvmlDeviceGetName(self, handle):
        return self.devices[handle[1] if isinstance(handle[1], int) else 0].encode()

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 66

    def nvmlDeviceGetPowerUsage(self, handle):
        return 412_345  # milliwatts

    def nvmlDeviceGetMemoryInfo(self, handle):
        if self.memory is None:
            raise NotSupported("Not Supported")
        return self.memory


def test_discrete_gpu_reports_device_memory_and_converts_power_to_watts():
    nvml = FakeNvml(memory=SimpleNamespace(total=141 * 2**30, used=37 * 2**30, free=104 * 2**30))
    sample = Telemetry(device_index=0, nvml=nvml).sample()
    assert sample.memory_source == GPU
    assert (sample.memory_used, sample.memory_total) == (37 * 2**30, 141 * 2**30)
    assert sample.device == "NVIDIA Test GPU"
    assert sample.utilization == 87.0 and sample.temperature == 66.0
    assert sample.power == pytest.approx(412.345)
    assert sample.note == ""


def test_unified_memory_device_falls_back_to_system_memory_but_keeps_gpu_readings():
    for memory in (None, SimpleNamespace(total=0, used=0, free=0)):  # NVML refuses, or reports no memory
        sample = Telemetry(device_index=0, nvml=FakeNvml(memory=memory)).sample()
        assert sample.memory_source == UNIFIED, memory
        assert sample.memory_total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert 0 < sample.memory_used < sample.memory_total
        assert sample.utilization == 87.0 and sample.power == pytest.approx(412.345)
        assert "unified memory" in sample.note


def test_no_nvidia_gpu_reports_system_memory_and_why():
    telemetry = Telemetry(nvml=FakeNvml(fail_init=RuntimeError("NVML Shared Library Not Found")))
    assert not telemetry.has_gpu
    sample = telemetry.sample()
    assert sample.memory_source == SYSTEM and sample.device == "System memory"
    assert sample.utilization is None and sample.temperature is None and sample.power is None
    assert "NVML Shared Library Not Found" in sample.note


def test_real_pynvml_on_this_machine_never_raises():
    sample = Telemetry().sample()  # here: no NVIDIA driver -> system memory; on a GPU machine -> the GPU
    assert sample.memory_total > 0 and 0 <= sample.memory_used <= sample.memory_total


def test_cuda_visible_devices_picks_the_nvml_device(monkeypatch):
    nvml = FakeNvml(memory=SimpleNamespace(total=10, used=1, free=9))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    Telemetry(nvml=nvml)
    assert nvml.asked_index == 3


def test_list_gpus_names_every_device_in_index_order():
    from hone.core.machine.telemetry import GpuListing, list_gpus

    nvml = FakeNvml(memory=SimpleNamespace(used=1, total=80 * 2**30), devices=("GPU A", "GPU B"))
    assert list_gpus(nvml) == [GpuListing(0, "GPU A", 80 * 2**30), GpuListing(1, "GPU B", 80 * 2**30)]
    assert nvml.shut_down
    assert list_gpus(FakeNvml(devices=("Spark",))) == [GpuListing(0, "Spark", 0)]  # unified: no memory of its own
    assert list_gpus(FakeNvml(fail_init=RuntimeError("no driver"))) == []


def test_close_shuts_nvml_down():
    nvml = FakeNvml(memory=SimpleNamespace(total=10, used=1, free=9))
    telemetry = Telemetry(nvml=nvml)
    telemetry.close()
    assert nvml.shut_down and not telemetry.has_gpu


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_system_memory_matches_sysconf():
    used, total = system_memory()
    assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < used < total


def test_importing_telemetry_does_not_import_torch():
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", "import hone.core.machine.telemetry, sys; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_gpu_memory_matches_cuda_mem_get_info():
    import torch

    free, total = torch.cuda.mem_get_info(0)
    sample = Telemetry().sample()
    assert sample.memory_source == GPU, f"expected device memory on a discrete GPU, got {sample}"
    assert abs(sample.memory_total - total) <= 0.02 * total, (
        f"NVML total {sample.memory_total / 2**30:.1f} GiB vs CUDA total {total / 2**30:.1f} GiB"
    )
    assert abs(sample.memory_used - (total - free)) <= 2 * 2**30, (
        f"NVML used {sample.memory_used / 2**30:.2f} GiB vs CUDA used {(total - free) / 2**30:.2f} GiB"
    )
    assert sample.temperature is not None and 0 < sample.temperature < 110, f"temperature {sample.temperature}"
    assert sample.power is not None and 0 < sample.power < 2000, f"power {sample.power} W"

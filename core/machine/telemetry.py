"""GPU telemetry for the Monitor page and the CLI: utilization, temperature, power and device memory.

Reads NVIDIA's management library through nvidia-ml-py (`pynvml`). Stdlib + pynvml only, so sampling never
imports torch. Where NVML cannot say how much memory the device has, the sample reports system memory instead
and says why in `note` (`Telemetry.sample` lists the cases).
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU = "gpu"
SYSTEM = "system"
UNIFIED = "unified"  # system memory that the GPU allocates from (DGX Spark's GB10, Jetson)


@dataclass(frozen=True)
class TelemetrySample:
    """One reading. Memory in bytes; None where the source cannot tell."""

    device: str  # e.g. "NVIDIA H200", or "System memory"
    memory_source: str  # "gpu", "system" or "unified": where memory_used / memory_total come from
    memory_used: int
    memory_total: int
    utilization: float | None = None  # percent of time the GPU was busy over the driver's last sample period
    temperature: float | None = None  # degrees Celsius
    power: float | None = None  # watts
    note: str = ""  # why memory comes from the system, when it does


class Telemetry:
    """Samples one GPU (the first visible one by default). Cheap to call once a second.

    Args:
        device_index: NVML index of the GPU; None = the first device CUDA_VISIBLE_DEVICES names (or index 0).
        nvml: the NVML module to use; None imports `pynvml`. Passing one lets a caller reuse an initialized
            library or observe the fallbacks.
    """

    def __init__(self, device_index: int | None = None, nvml: Any = None):
        self._nvml = None
        self._handle = None
        self._name = ""
        self.unavailable_reason = ""
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
        except ImportError:
            self.unavailable_reason = "nvidia-ml-py is not installed"
            return
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable NVIDIA GPU
            self.unavailable_reason = f"no NVIDIA GPU found ({_nvml_message(e)})"
            return
        try:
            self._handle = _visible_device_handle(nvml, device_index)
            self._name = _text(nvml.nvmlDeviceGetName(self._handle))
            self._nvml = nvml
        except Exception as e:
            self.unavailable_reason = f"no NVIDIA GPU found ({_nvml_message(e)})"
            _quietly(nvml.nvmlShutdown)

    @property
    def has_gpu(self) -> bool:
        return self._nvml is not None

    def sample(self) -> TelemetrySample:
        """Read the device now. Never raises: a reading NVML refuses becomes None.

        Memory comes from the system instead of the GPU, with the reason in `note`, when:

        - there is no NVIDIA GPU, no driver, or no nvidia-ml-py: system memory, no utilization/temperature/power;
        - the device has unified memory (DGX Spark's GB10, Jetson) and NVML reports no memory of its own: system
          memory (the GPU allocates from it; source `unified`), with the GPU's utilization, temperature and power
          still from NVML.
        """
        if self._nvml is None:
            used, total = system_memory()
            return TelemetrySample("System memory", SYSTEM, used, total, note=self.unavailable_reason)
        nvml, handle = self._nvml, self._handle
        utilization = _quietly(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        temperature = _quietly(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
        power = _quietly(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # NVML reports milliwatts
        memory = _quietly(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None and memory.total > 0:
            return TelemetrySample(
                self._name, GPU, int(memory.used), int(memory.total), utilization, temperature, power
            )
        used, total = system_memory()
        return TelemetrySample(
            self._name,
            UNIFIED,
            used,
            total,
            utilization,
            temperature,
            power,
            note="unified memory: the GPU shares system memory, which is shown instead",
        )

    def close(self) -> None:
        if self._nvml is not None:
            _quietly(self._nvml.nvmlShutdown)
            self._nvml = None


def system_memory() -> tuple[int, int]:
    """(used, total) bytes of system RAM; used = total - available (page cache that can be freed is not used)."""
    if sys.platform.startswith("linux"):
        info = _meminfo(Path("/proc/meminfo"))
        if "MemTotal" in info:
            total = info["MemTotal"]
            available = info.get("MemAvailable", info.get("MemFree", 0))
            return total - available, total
    if sys.platform == "win32":
        return _windows_memory()
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return total - free, total
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _meminfo(path: Path) -> dict[str, int]:
    """/proc/meminfo as bytes per key."""
    values = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return values


def _windows_memory() -> tuple[int, int]:
    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    status = MemoryStatusEx()
    status.dwLength = ctypes.sizeof(MemoryStatusEx)
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
        return 0, 0
    return status.ullTotalPhys - status.ullAvailPhys, status.ullTotalPhys


@dataclass(frozen=True)
class GpuListing:
    """One NVIDIA GPU of this machine, by NVML index (the index CUDA_VISIBLE_DEVICES takes)."""

    index: int
    name: str
    memory_total: int  # bytes; 0 where NVML cannot tell (unified memory)


def list_gpus(nvml: Any = None) -> list[GpuListing]:
    """Every NVIDIA GPU NVML sees, in index order; empty without a GPU, a driver or nvidia-ml-py."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        found = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = _quietly(lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h))
            found.append(
                GpuListing(index, _text(nvml.nvmlDeviceGetName(handle)), int(memory.total) if memory is not None else 0)
            )
        return found
    except Exception:
        return []
    finally:
        _quietly(nvml.nvmlShutdown)


def _visible_device_handle(nvml: Any, device_index: int | None) -> Any:
    """The NVML handle of the GPU torch calls cuda:0 (CUDA_VISIBLE_DEVICES may name an index or a UUID)."""
    if device_index is not None:
        return nvml.nvmlDeviceGetHandleByIndex(device_index)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(visible))
    if visible.startswith(("GPU-", "MIG-")):
        return nvml.nvmlDeviceGetHandleByUUID(visible)
    return nvml.nvmlDeviceGetHandleByIndex(0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_message(error: Exception) -> str:
    return str(error) or type(error).__name__


def _quietly(read):
    """Call `read`; None if NVML refuses (not supported on this device, no permission, GPU lost)."""
    try:
        return read()
    except Exception:
        return None

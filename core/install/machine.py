"""What an install depends on, read off this machine: OS, CPU architecture, NVIDIA GPUs and driver, glibc.

Stdlib only: the installers run this before Hone's dependencies exist. `nvidia-smi` ships with the NVIDIA driver
on Linux and Windows, so asking it both finds the driver and reads what it supports.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

# Names and words by which GPUs that share memory with the host show up: DGX Spark's GB10 and the Jetsons. NVML
# (and so nvidia-smi) reports no memory of their own ("[N/A]", "Not Supported"), which is the general sign.
UNIFIED_MEMORY_GPUS = ("GB10", "Orin", "Thor", "Xavier")
NO_MEMORY_READING = ("[N/A]", "N/A", "Not Supported", "[Not Supported]", "")


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as `nvidia-smi` lists it."""

    name: str  # "NVIDIA GeForce RTX 4060 Laptop GPU"
    memory_mib: int | None  # None where the GPU has no memory of its own (unified memory)
    compute_capability: tuple[int, int] | None  # (8, 9); None when the driver does not report it

    @property
    def unified_memory(self) -> bool:
        return self.memory_mib is None or any(word in self.name for word in UNIFIED_MEMORY_GPUS)


@dataclass(frozen=True)
class Machine:
    """The facts an install plan is made of.

    `system` is "linux", "windows" or "darwin"; `arch` is "x86_64" or "aarch64" (Windows' AMD64 and ARM64 map
    to these). `driver_cuda` is the newest CUDA version the driver supports (nvidia-smi's "CUDA Version"), None
    without an NVIDIA driver. `glibc` is None off Linux or on another C library.
    """

    system: str
    arch: str
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    driver_cuda: tuple[int, int] | None = None
    glibc: tuple[int, int] | None = None
    notes: tuple[str, ...] = field(default=())  # what could not be read, and why

    @property
    def has_nvidia_driver(self) -> bool:
        return self.driver_version is not None

    @property
    def unified_memory(self) -> bool:
        return bool(self.gpus) and all(gpu.unified_memory for gpu in self.gpus)

    def describe(self) -> str:
        """One line: "linux aarch64, glibc 2.39, NVIDIA GB10 (unified memory), driver 580.95 (CUDA 13.0)"."""
        parts = [f"{self.system} {self.arch}"]
        if self.glibc:
            parts.append(f"glibc {self.glibc[0]}.{self.glibc[1]}")
        for gpu in self.gpus:
            memory = "unified memory" if gpu.unified_memory else f"{gpu.memory_mib / 1024:.0f} GiB"
            parts.append(f"{gpu.name} ({memory})")
        if self.driver_version:
            cuda = f" (CUDA {self.driver_cuda[0]}.{self.driver_cuda[1]})" if self.driver_cuda else ""
            parts.append(f"driver {self.driver_version}{cuda}")
        else:
            parts.append("no NVIDIA driver")
        return ", ".join(parts)


Runner = Callable[[list[str]], str]  # runs a command, returns its stdout; raises OSError or CalledProcessError


def probe_machine(run: Runner | None = None) -> Machine:
    """This machine's facts. `run` replaces running commands (tests feed recorded `nvidia-smi` output)."""
    run = run or _run
    system = {"win32": "windows", "darwin": "darwin"}.get(
        sys.platform, "linux" if sys.platform.startswith("linux") else sys.platform
    )
    arch = normalize_arch(platform.machine())
    glibc = _glibc() if system == "linux" else None
    gpus, driver, cuda, notes = read_nvidia_smi(run)
    return Machine(system, arch, gpus, driver, cuda, glibc, notes)


def normalize_arch(machine: str) -> str:
    """`platform.machine()` spelled the Linux way: AMD64/x64 -> x86_64, ARM64/arm64 -> aarch64."""
    lowered = machine.lower()
    if lowered in ("amd64", "x64", "x86_64"):
        return "x86_64"
    if lowered in ("arm64", "aarch64", "armv8l"):
        return "aarch64"
    return lowered


def read_nvidia_smi(run: Runner) -> tuple[tuple[Gpu, ...], str | None, tuple[int, int] | None, tuple[str, ...]]:
    """GPUs, driver version, the driver's CUDA version and notes, from `nvidia-smi`; no driver -> ((), None, None)."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"]
    try:
        listing = run(query)
    except (OSError, subprocess.CalledProcessError) as e:
        return (), None, None, (f"nvidia-smi did not run ({_short(e)}): no NVIDIA driver",)
    gpus, driver = parse_gpu_query(listing)
    if driver is None:
        return (), None, None, ("nvidia-smi lists no GPU",)
    try:
        cuda = parse_driver_cuda(run(["nvidia-smi"]))
    except (OSError, subprocess.CalledProcessError) as e:
        return gpus, driver, None, (f"nvidia-smi's summary did not run ({_short(e)}): CUDA version unknown",)
    notes = () if cuda else ("nvidia-smi does not say which CUDA version the driver supports",)
    return gpus, driver, cuda, notes


def parse_gpu_query(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    """Rows of `--query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader`."""
    gpus, driver = [], None
    for line in text.splitlines():
        fields = [part.strip() for part in line.split(",")]
        if len(fields) < 3 or not fields[0]:
            continue
        name, driver = fields[0], fields[1]
        memory = re.match(r"(\d+)\s*MiB", fields[2])
        capability = re.fullmatch(r"(\d+)\.(\d+)", fields[3]) if len(fields) > 3 else None
        gpus.append(
            Gpu(
                name,
                int(memory.group(1)) if memory else None,
                (int(capability.group(1)), int(capability.group(2))) if capability else None,
            )
        )
    return tuple(gpus), driver


def parse_driver_cuda(summary: str) -> tuple[int, int] | None:
    """The "CUDA Version: 13.0" of nvidia-smi's summary table."""
    found = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", summary)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _glibc() -> tuple[int, int] | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.39"
    except (ValueError, OSError, AttributeError):
        text = ""
    found = re.search(r"(\d+)\.(\d+)", text) if text.startswith("glibc") else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def _run(command: list[str]) -> str:
    executable = shutil.which(command[0])
    if executable is None:
        raise FileNotFoundError(f"{command[0]} is not on PATH")
    done = subprocess.run([executable, *command[1:]], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def _short(error: Exception) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        output = (error.stderr or error.stdout or "").strip().splitlines()
        return f"exit {error.returncode}" + (f": {output[-1]}" if output else "")
    return str(error)

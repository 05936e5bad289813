"""This machine and this process, read without torch: the facts a run's choices depend on (`MachineFacts`, read by
`read_machine`), GPU telemetry for a live view (`Telemetry`, `TelemetrySample`, `list_gpus`), whether the installed
PyTorch works here (`check_runtime`), and what a Hone process sets before anything loads
(`prefer_expandable_segments`, `guard_bitsandbytes_import`).

`MachineFacts` is what a run can use here; the installers' view of the machine (OS, architecture, driver, glibc:
which PyTorch build to install) is `hone.core.install.Machine`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from hone.core.install.runtime import check_runtime
from hone.core.machine.allocator import prefer_expandable_segments
from hone.core.machine.telemetry import GpuListing, Telemetry, TelemetrySample, list_gpus
from hone.core.models.hub_kernels import guard_bitsandbytes_import

__all__ = [
    "GpuListing",
    "MachineFacts",
    "Telemetry",
    "TelemetrySample",
    "check_runtime",
    "guard_bitsandbytes_import",
    "list_gpus",
    "prefer_expandable_segments",
    "read_machine",
]


@dataclass(frozen=True)
class MachineFacts:
    """The facts a run's choices depend on.

    Attributes:
        gpu: the first NVIDIA GPU's name; "" when there is none (or no driver, or no nvidia-ml-py).
        bitsandbytes: whether the bitsandbytes package is installed (QLoRA and the 8-bit optimizer need it).
        reason: why no GPU was found, in words ("" when one was).
        gpus: every NVIDIA GPU (GpuListing); a run may train on several.
    """

    gpu: str = ""
    bitsandbytes: bool = False
    reason: str = ""
    gpus: tuple = ()

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu)


def read_machine() -> MachineFacts:
    """Read this machine (NVML and the package index; no torch). Meant for a background task."""
    telemetry = Telemetry()
    try:
        sample = telemetry.sample() if telemetry.has_gpu else None
        gpu = sample.device if sample is not None else ""
    finally:
        telemetry.close()
    return MachineFacts(
        gpu=gpu,
        bitsandbytes=importlib.util.find_spec("bitsandbytes") is not None,
        reason=telemetry.unavailable_reason,
        gpus=tuple(list_gpus()) if gpu else (),
    )

"""Does the installed PyTorch work on this machine's GPU? Plain-words findings for the app's first start and for
`python -m hone.core.install check`, instead of a traceback on the first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hone.core.install.machine import Machine, probe_machine
from hone.core.install.plan import DRIVERS_PAGE

OK, WARNING, ERROR = "ok", "warning", "error"


@dataclass(frozen=True)
class Finding:
    level: str  # ok, warning or error
    title: str  # one plain sentence
    fix: str = ""  # what to do
    detail: str = ""  # the technical reason, for the log


def repair_advice(system: str) -> str:
    """How to redo the environment step on this system, as the end of a sentence."""
    if system == "windows":
        return 'run "Repair Hone Studio" from the Start menu'
    return "run install.sh again (it keeps your runs and settings)"


def check_runtime(machine: Machine | None = None, torch: Any = None) -> list[Finding]:
    """Findings about PyTorch on this machine, most serious first; `[Finding(OK, ...)]` when all is well.

    Args:
        machine: the machine's facts; None probes this one.
        torch: the torch module to check; None imports it (tests pass a stand-in for a CUDA build).
    """
    machine = machine or probe_machine()
    repair = repair_advice(machine.system)
    repair_sentence = f"{repair[0].upper()}{repair[1:]}."
    if torch is None:
        try:
            import torch
        except Exception as e:  # a broken install raises ImportError or OSError (a DLL that does not load), or worse
            return [
                Finding(
                    ERROR,
                    "PyTorch does not load, so Hone Studio cannot train.",
                    repair_sentence,
                    f"{type(e).__name__}: {e}",
                )
            ]
    built_for = getattr(torch.version, "cuda", None)
    if built_for is None:
        return [_cpu_build_finding(machine, torch.__version__, repair)]
    if not machine.has_nvidia_driver:
        return [
            Finding(
                ERROR,
                "No NVIDIA driver is installed, so the GPU build of PyTorch cannot run.",
                f"Install the driver from {DRIVERS_PAGE} and restart Hone Studio.",
            )
        ]
    needed = _version(built_for)
    if machine.driver_cuda is not None and needed is not None and machine.driver_cuda < needed:
        have = f"{machine.driver_cuda[0]}.{machine.driver_cuda[1]}"
        return [
            Finding(
                ERROR,
                f"The NVIDIA driver {machine.driver_version} is too old for this PyTorch: it supports "
                f"CUDA {have}, PyTorch was built for CUDA {built_for}.",
                f"Update the driver from {DRIVERS_PAGE}, or {repair}: it picks the build your driver supports.",
            )
        ]
    if not torch.cuda.is_available():
        return [
            Finding(
                ERROR,
                "PyTorch cannot use the GPU.",
                f"Restart the computer; if that does not help, update the driver from {DRIVERS_PAGE}, then {repair}.",
                _cuda_init_error(torch),
            )
        ]
    arches = list(torch.cuda.get_arch_list())
    findings = []
    for index in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(index))
        if not has_kernels_for(capability, arches):
            name = torch.cuda.get_device_name(index)
            findings.append(
                Finding(
                    ERROR,
                    f"This PyTorch has no GPU code for the {name} (compute capability "
                    f"{capability[0]}.{capability[1]}).",
                    repair_sentence,
                    f"PyTorch {torch.__version__} is built for {', '.join(arches)}",
                )
            )
    if findings:
        return findings
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return [
        Finding(
            OK,
            f"Ready to train on {names}: PyTorch {torch.__version__} (CUDA {built_for}), NVIDIA driver "
            f"{machine.driver_version}.",
        )
    ]


def has_kernels_for(capability: tuple[int, int], arches: list[str]) -> bool:
    """Whether a build with these `get_arch_list()` entries runs on a GPU of this compute capability: machine code
    for the same major at a minor at most the GPU's (sm_120 code runs on sm_121), or PTX for any lower version."""
    for arch in arches:
        kind, _, digits = arch.partition("_")
        if not digits.isdigit() or len(digits) < 2:
            continue
        version = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and version[0] == capability[0] and version[1] <= capability[1]:
            return True
        if kind == "compute" and version <= capability:
            return True
    return False


def _cpu_build_finding(machine: Machine, version: str, repair: str) -> Finding:
    if machine.gpus:
        names = ", ".join(gpu.name for gpu in machine.gpus)
        return Finding(
            WARNING,
            f"PyTorch {version} is the CPU build, so training will not use the {names}.",
            f"{repair[0].upper()}{repair[1:]} (without --cpu).",
        )
    return Finding(
        WARNING,
        "No NVIDIA GPU was found: training runs on the CPU, which is very slow (fine for the demo).",
        f"If this machine has an NVIDIA GPU, install its driver from {DRIVERS_PAGE}, then {repair}.",
    )


def _version(text: str) -> tuple[int, int] | None:
    major, _, rest = text.partition(".")
    minor = rest.partition(".")[0]
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


def _cuda_init_error(torch: Any) -> str:
    try:
        torch.cuda.init()
    except Exception as e:  # the reason torch gives ("CUDA driver initialization failed", "no CUDA GPUs ...")
        return f"{type(e).__name__}: {e}"
    return "torch.cuda.is_available() is False"

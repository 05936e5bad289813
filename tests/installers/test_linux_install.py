"""installers/linux/install.sh end to end, into a temporary HOME, from PyPI: install from the checkout, use what it
installed (launcher, demo, app, menu entry), upgrade in place from the release archive, uninstall.

PyTorch's own index is not reachable here, so `--wheels` hands install.sh the CPU torch wheel that pip finds, and
`--python` an existing interpreter (uv's Python downloads are not reachable either). uv is taken off PATH, so
install.sh fetches it from PyPI as on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from hone.core.version import __version__

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SH = ROOT / "installers" / "linux" / "install.sh"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="install.sh is for Linux")


def without_uv(path: str) -> str:
    return os.pathsep.join(folder for folder in path.split(os.pathsep) if folder and not (Path(folder) / "uv").exists())


class Home:
    """A temporary HOME with its environment, and install.sh run in it."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        # Nothing of this session's own folders: XDG paths, Hone's test cache and venv follow the temporary HOME.
        dropped = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HONE_CACHE", "VIRTUAL_ENV")
        self.env = {key: value for key, value in os.environ.items() if key not in dropped}
        self.env.update(HOME=str(self.home), PATH=without_uv(os.environ["PATH"]), QT_QPA_PLATFORM="offscreen")
        self.data = self.home / ".local" / "share" / "hone-studio"
        self.bin = self.home / ".local" / "bin"
        self.desktop = self.home / ".local" / "share" / "applications" / "hone-studio.desktop"
        self.icon = self.home / ".local" / "share" / "icons" / "hicolor" / "256x256" / "apps" / "hone-studio.png"
        self.seconds: dict[str, float] = {}

    def run(self, label: str, *command, timeout: int = 900) -> subprocess.CompletedProcess:
        start = time.monotonic()
        done = subprocess.run(
            [str(c) for c in command], env=self.env, cwd=self.root, capture_output=True, text=True, timeout=timeout
        )
        self.seconds[label] = time.monotonic() - start
        print(f"{label}: {self.seconds[label]:.0f} s")
        return done


@pytest.fixture(scope="module")
def torch_wheels(tmp_path_factory) -> Path:
    """A folder holding the CPU build of the torch this suite runs on, as pip finds it."""
    import torch

    folder = tmp_path_factory.mktemp("wheels")
    version = torch.__version__.split("+")[0]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(folder),
            f"torch=={version}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    wheels = list(folder.glob("torch-*.whl"))
    if done.returncode != 0 or not wheels or "+cpu" not in wheels[0].name:
        pytest.skip(f"pip finds no CPU wheel of torch {version} here: {done.stderr.strip()[-300:]}")
    return folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory, torch_wheels) -> tuple[Home, subprocess.CompletedProcess]:
    home = Home(tmp_path_factory.mktemp("install"))
    done = home.run(
        "install from the checkout", "bash", INSTALL_SH, "--cpu", "--python", sys.executable, "--wheels", torch_wheels
    )
    return home, done


def test_install_from_the_checkout(installed):
    home, done = installed
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Fetching uv from https://pypi.org" in done.stdout
    assert f"Hone Studio {__version__} is installed" in done.stdout
    log = (home.data / "install.log").read_text()
    assert "Installing PyTorch" in log and "Checking the installed PyTorch" in log and "Done." in log


def test_the_launchers_work(installed):
    home, _ = installed
    version = home.run("hone --version", home.bin / "hone", "--version")
    assert version.stdout.strip() == f"hone {__version__}"
    demo = home.run(
        "hone demo", home.bin / "hone", "demo", "--steps", "2", "--eval-rows", "4", "--runs-dir", home.root / "runs"
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "+ Hone LoRA" in demo.stderr and "/4 (" in demo.stderr  # the demo reports on stderr
    shot = home.root / "studio.png"
    studio = home.run("hone studio --screenshot", home.bin / "hone", "studio", "--screenshot", shot)
    assert studio.returncode == 0, studio.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    gui = home.run("hone-studio --screenshot", home.bin / "hone-studio", "--screenshot", home.root / "gui.png")
    assert gui.returncode == 0 and (home.root / "gui.png").stat().st_size > 10_000


def test_menu_entry_and_icon(installed):
    home, _ = installed
    entry = home.desktop.read_text()
    assert f'Exec="{home.bin / "hone-studio"}"' in entry and "Icon=hone-studio" in entry
    assert home.icon.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    validate = shutil.which("desktop-file-validate")
    if validate is None:
        pytest.skip("desktop-file-validate is not installed (Debian: desktop-file-utils)")
    checked = subprocess.run([validate, str(home.desktop)], capture_output=True, text=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout


def test_upgrade_in_place_from_the_release_archive_then_uninstall(installed, torch_wheels, tmp_path):
    home, first = installed
    assert first.returncode == 0
    runs = home.home / "Documents" / "Hone Studio" / "runs" / "kept-run"
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text("{}\n")
    venv_config = (home.data / "venv" / "pyvenv.cfg").read_text()

    build = home.run("build the release archive", "bash", ROOT / "installers" / "linux" / "build.sh", "--out", tmp_path)
    assert build.returncode == 0, build.stderr
    [archive] = tmp_path.glob(f"hone-studio-{__version__}-linux.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    unpacked = tmp_path / f"hone-studio-{__version__}"
    again = home.run(
        "upgrade from the archive",
        "bash",
        unpacked / "install.sh",
        "--cpu",
        "--python",
        sys.executable,
        "--wheels",
        torch_wheels,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "Fetching uv" not in again.stdout  # the uv fetched the first time is reused
    assert "Building Hone's wheel" not in again.stdout and f"hone_studio-{__version__}-py3-none-any.whl" in again.stdout
    assert (home.data / "venv" / "pyvenv.cfg").read_text() == venv_config
    assert (runs / "metrics.jsonl").exists()
    assert home.run("hone --version", home.bin / "hone", "--version").returncode == 0

    removed = home.run("uninstall", "bash", INSTALL_SH, "--uninstall")
    assert removed.returncode == 0
    for path in (home.data, home.bin / "hone", home.bin / "hone-studio", home.desktop, home.icon):
        assert not path.exists() and not path.is_symlink(), path
    assert (runs / "metrics.jsonl").exists() and "Kept: your runs in" in removed.stdout
    purged = home.run("uninstall --purge", "bash", INSTALL_SH, "--uninstall", "--purge")
    assert purged.returncode == 0 and not (home.home / "Documents" / "Hone Studio").exists()
    print("seconds per step:", {label: round(s) for label, s in home.seconds.items()})

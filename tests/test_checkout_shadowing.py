"""From the checkout root, no top-level folder hides an installed distribution of the same name, and hone.* imports.

Python puts the current folder first on sys.path for `python -c` and `python -m`, and pytest's `pythonpath = ["."]`
does the same, so a regular package at the root (a folder with `__init__.py`) would win over the installed
distribution of that name: transformers >= 5.25 imports the `kernels` distribution and got the checkout's kernels/.
The top-level folders are namespace portions instead, which the import system takes only when no regular package or
module of that name is found anywhere on sys.path; setup.py maps them onto hone.app, hone.core, ...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every folder at the root whose name could be imported.
FOLDERS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name.isidentifier() and not p.name.startswith("_"))
# What each installed layout must still import: one module per hone package, and the packages themselves.
HONE_MODULES = (
    "hone.app",
    "hone.core",
    "hone.kernels",
    "hone.resources",
    "hone.core.config",
    "hone.core.version",
    "hone.kernels.reference",
    "hone.app.studio_command",
)

# Run from the checkout root: imports every top-level name, then the hone modules, and prints where each came from.
PROBE = """
import importlib, json, sys
sys.path.insert(0, {root!r})  # as pytest's pythonpath = ["."] does; `python -c` already has '' first
names = {names!r}
found = {{name: getattr(importlib.import_module(name), "ORIGIN", None) for name in names}}
hone = {{}}
for module in {modules!r}:
    m = importlib.import_module(module)
    hone[module] = m.__file__ or list(m.__path__)[0]
print(json.dumps({{"found": found, "hone": hone}}))
"""


def test_no_top_level_folder_is_a_regular_package():
    regular = [name for name in FOLDERS if (ROOT / name / "__init__.py").exists()]
    assert not regular, (
        f"{regular} have an __init__.py at the checkout root: from there they would hide an installed "
        "distribution of the same name; keep package code in modules below them (see setup.py)"
    )


def fake_distributions(site: Path, names: list[str]) -> None:
    """An installed regular package and its metadata for each name, as pip would leave them."""
    for name in names:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text('ORIGIN = "installed"\n')
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text("")


def probe(env: dict[str, str], *python_flags: str) -> dict:
    code = PROBE.format(root=str(ROOT), names=FOLDERS, modules=HONE_MODULES)
    done = subprocess.run(
        [sys.executable, *python_flags, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_installed_distributions_win_over_the_checkout_with_the_editable_install(tmp_path):
    fake_distributions(tmp_path, FOLDERS)
    result = probe(child_env(PYTHONPATH=str(tmp_path)))
    assert result["found"] == dict.fromkeys(FOLDERS, "installed")
    for module, where in result["hone"].items():
        assert Path(where).is_relative_to(ROOT), f"{module} came from {where}, not from the checkout"


@pytest.mark.slow
def test_installed_distributions_win_over_the_checkout_with_the_wheel(tmp_path):
    wheel = subprocess.run(
        ["bash", str(ROOT / "installers" / "build_wheel.sh"), str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        inits = [name for name in archive.namelist() if name.count("/") == 2 and name.endswith("/__init__.py")]
    assert {top for top in tops if not top.endswith(".dist-info")} == {"hone"}
    assert not inits, f"{inits}: the hone.* packages are namespace portions in the wheel as in the checkout"
    installed = tmp_path / "wheel-site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--target",
            str(installed),
            wheel,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    fakes = tmp_path / "fakes"
    fake_distributions(fakes, FOLDERS)
    # -S: no site-packages processing, so the editable install's import hook is not there and hone comes from the
    # wheel; the libraries still come from this interpreter's site-packages, named last.
    path = os.pathsep.join(
        [str(fakes), str(installed), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    )
    result = probe(child_env(PYTHONPATH=path), "-S")
    assert result["found"] == dict.fromkeys(FOLDERS, "installed")
    for module, where in result["hone"].items():
        assert Path(where).is_relative_to(installed), f"{module} came from {where}, not from the wheel"


@pytest.mark.slow
def test_hone_imports_silently_from_the_checkout_root():
    """The real `kernels` distribution (transformers >= 5.25 imports it) is found, and nothing is printed: not the
    Hub-kernel fetch bitsandbytes attempts at import (hone.core.models.hub_kernels keeps it offline)."""
    env = child_env()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        env.pop(name, None)  # as in a user's shell: an unguarded bitsandbytes would try the Hub
    done = subprocess.run(
        [sys.executable, "-c", "import hone.core.speed.moe, hone.kernels, hone.core.train.lora"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

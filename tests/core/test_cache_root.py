"""Hone's one user cache folder: HONE_CACHE overrides it, else each platform's convention (platformdirs), and the
GGUF conversions, the tokenized datasets and the Triton tuning all live under it."""

from __future__ import annotations

import sys

import platformdirs
import pytest
from platformdirs.macos import MacOS
from platformdirs.unix import Unix
from platformdirs.windows import Windows

from hone.core.data.cache import default_cache_dir
from hone.core.models.load import gguf_conversion_folder
from hone.core.resources import CACHE_ENV, cache_root


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home folder and no cache variables: what a user who set nothing has."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "home"))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return tmp_path / "home"


def _as_platform(monkeypatch, platform: str, dirs_class) -> None:
    """Answer as on another OS: sys.platform names it, platformdirs' class for it computes the folders."""
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(platformdirs, "PlatformDirs", dirs_class)


def test_hone_cache_overrides_and_takes_subfolders(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    assert cache_root("models", "x-1234") == tmp_path / "mine" / "models" / "x-1234"


def test_hone_cache_expands_the_home_folder(home, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "~/elsewhere")
    assert cache_root("datasets") == home / "elsewhere" / "datasets"


def test_linux_default_is_xdg_cache_home_or_dot_cache(home, tmp_path, monkeypatch):
    _as_platform(monkeypatch, "linux", Unix)
    assert cache_root() == home / ".cache" / "hone"  # where earlier versions kept it
    monkeypatch.setenv(CACHE_ENV, "  ")  # blank counts as unset
    assert cache_root("triton") == home / ".cache" / "hone" / "triton"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root("models") == tmp_path / "xdg" / "hone" / "models"


def test_windows_default_is_local_app_data_without_an_author_level(home, tmp_path, monkeypatch):
    import platformdirs.windows

    local = tmp_path / "AppData" / "Local"
    asked = []

    def win_folder(csidl: str) -> str:
        asked.append(csidl)
        return str(local)

    _as_platform(monkeypatch, "win32", Windows)
    monkeypatch.setattr(platformdirs.windows, "get_win_folder", win_folder)
    assert cache_root("models") == local / "HoneStudio" / "Cache" / "models"
    assert asked == ["CSIDL_LOCAL_APPDATA"]  # per user and not roaming: caches stay on this machine


def test_macos_default_is_library_caches(home, monkeypatch):
    _as_platform(monkeypatch, "darwin", MacOS)
    assert cache_root() == home / "Library" / "Caches" / "HoneStudio"


def test_every_cache_lives_under_the_one_root(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "root"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert gguf_conversion_folder(gguf).parent == tmp_path / "root" / "models"
    assert default_cache_dir() == tmp_path / "root" / "datasets"


def test_resources_imports_without_torch():
    import subprocess

    code = "import sys, hone.core.resources; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

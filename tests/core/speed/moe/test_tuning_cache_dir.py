"""Where the Triton grouped GEMMs keep their tuned block sizes: the kernels keep them in memory until told a folder,
and setting up an MoE model tells them Hone's user cache (`cache_root("triton")`). The timing itself needs a GPU
(tests/kernels/moe/test_grouped_gemm.py); the hand-over and the file round trip are checked here."""

from __future__ import annotations

import json

import pytest

from hone.core.resources import CACHE_ENV, cache_root
from hone.core.speed import moe
from hone.kernels.moe.grouped_gemm import tuning

TUNED = tuning.KernelConfig(64, 128, 64, 4, 3)
KEY = "forward|Test GPU|sm90|bfloat16|rows512|n384|k256|00000"


@pytest.fixture
def fresh_tuning(monkeypatch):
    """An untold tuning module: nothing in memory, no folder, nothing read from disk yet."""
    monkeypatch.setattr(tuning, "_cache_dir", None)
    monkeypatch.setattr(tuning, "_memory", {})
    monkeypatch.setattr(tuning, "_disk_loaded", set())
    return tuning


def test_configuring_an_moe_model_names_the_user_cache(fresh_tuning, tiny_moe_cache, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    assert fresh_tuning.cache_dir() is None
    moe.configure(tiny_moe_cache("tiny-moe-qwen3"), "torch", "cpu")
    assert fresh_tuning.cache_dir() == str(cache_root("triton")) == str(tmp_path / "triton")


def test_untold_kernels_keep_tuned_configs_in_memory_only(fresh_tuning, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # the kernels do not read it: only core decides the folder
    monkeypatch.chdir(tmp_path)
    fresh_tuning._memory[KEY] = TUNED
    fresh_tuning._save_disk()
    assert not list(tmp_path.rglob("*.json"))


def test_told_kernels_write_tuned_configs_and_a_later_process_reads_them(fresh_tuning, tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "triton"
    fresh_tuning.set_cache_dir(folder)
    fresh_tuning._memory[KEY] = TUNED
    fresh_tuning._save_disk()
    saved = json.loads((folder / tuning.CACHE_FILE).read_text(encoding="utf-8"))
    assert saved == {KEY: {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3}}
    # A new process: empty memory, told the same folder.
    monkeypatch.setattr(tuning, "_memory", {})
    monkeypatch.setattr(tuning, "_disk_loaded", set())
    fresh_tuning._load_disk()
    assert fresh_tuning._memory == {KEY: TUNED}
    fresh_tuning.set_cache_dir(None)
    assert fresh_tuning.cache_dir() is None

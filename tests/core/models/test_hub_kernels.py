"""Hub kernels stay off: every model load passes use_kernels=False (unless USE_HUB_KERNELS asks), loads work where the
`kernels` package is missing, and bitsandbytes' first import neither fetches a Hub kernel nor prints about it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hone.core.config import ModelConfig
from hone.core.models.hub_kernels import from_pretrained_options, hub_kernels_requested

ROOT = Path(__file__).resolve().parents[3]

# A stand-in bitsandbytes that does at import what bitsandbytes >= 0.49 does on a CPU with AVX512-BF16, and a stand-in
# `kernels` whose get_kernel "fetches" (returns True): whether the fetch happened is in bitsandbytes.FETCHED.
FAKE_BITSANDBYTES = """
import logging
try:
    from kernels import get_kernel
    FETCHED = get_kernel("kernels-community/quantization-bitsandbytes", version=1)
except Exception as exc:
    FETCHED = False
    logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
        "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure ...", exc)
"""
GUARDED_IMPORT = """
import importlib.util, sys
from hone.core.models.hub_kernels import guard_bitsandbytes_import
guard_bitsandbytes_import()
guard_bitsandbytes_import()  # idempotent
assert importlib.util.find_spec("bitsandbytes") is not None  # asking does not use the guard up
import kernels
import bitsandbytes
assert sys.modules["kernels"] is kernels  # restored for transformers
print(bitsandbytes.FETCHED)
"""


@pytest.mark.parametrize(("requested", "fetched"), [("", "False"), ("1", "True")])
def test_bitsandbytes_is_imported_without_the_hub_unless_asked(tmp_path, requested, fetched):
    (tmp_path / "bitsandbytes").mkdir()
    (tmp_path / "bitsandbytes" / "__init__.py").write_text(FAKE_BITSANDBYTES)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("def get_kernel(repo_id, **kwargs):\n    return True\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "USE_HUB_KERNELS": requested}
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_IMPORT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, fetched, "")


def test_the_user_asks_for_hub_kernels_with_the_environment_variable(monkeypatch):
    for value, requested in (("1", True), ("yes", True), (" TRUE ", True), ("0", False), ("no", False), ("", False)):
        monkeypatch.setenv("USE_HUB_KERNELS", value)
        assert hub_kernels_requested() is requested
        assert from_pretrained_options() == {"use_kernels": requested}
    monkeypatch.delenv("USE_HUB_KERNELS")
    assert from_pretrained_options() == {"use_kernels": False}


def test_a_model_loads_where_the_kernels_package_is_missing(tiny_model_dir, monkeypatch):
    """transformers >= 5.25 turns Hub kernels on by default and then raises "Kernels are not available" without the
    `kernels` package: Hone's load asks for them off."""
    import transformers.modeling_utils as modeling_utils

    from hone.core.models.load import load_model

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    monkeypatch.setattr(modeling_utils, "is_kernels_available", lambda: False, raising=False)
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir("tiny-dense"))), device="cpu")
    assert getattr(loaded.model, "use_kernels", False) is False


# Receivers of `.from_pretrained` that load no model weights (tokenizers, configs, adapters onto a loaded model).
_NOT_A_MODEL = ("Tokenizer", "Processor", "Config", "PeftModel", "tokenizer", "processor")
# Loads that are not Hone's: the image processor class core/vision/processor.py picks by name, and Unsloth's own
# loaders in the peer benchmark (run as Unsloth runs them).
_NOT_HONES = {"cls", "FastLanguageModel", "FastVisionModel"}


def model_loads_without_the_options() -> list[str]:
    missing = []
    for path in sorted((ROOT / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained"
            ):
                continue
            receiver = ast.unparse(node.func.value)
            if receiver in _NOT_HONES or any(word in receiver for word in _NOT_A_MODEL):
                continue
            spread = [k.value for k in node.keywords if k.arg is None]
            if not any(isinstance(v, ast.Call) and ast.unparse(v.func) == "from_pretrained_options" for v in spread):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {receiver}.from_pretrained")
    return missing


def test_every_model_load_in_core_passes_the_hub_kernel_options():
    assert not model_loads_without_the_options(), "pass **from_pretrained_options() (hone.core.models.hub_kernels)"

"""Shared fixtures: the real SmolLM2 tokenizer (from the bundled GGUF, converted once and cached) and tiny
random-init models saved as real model folders, so tests go through the same loaders as users do.

No test downloads anything: HF_HUB_OFFLINE is set for the whole session.

Every test is marked with its area, one marker per folder between tests/ and its file (registered in pyproject.toml),
so `pytest -m "gpu and moe" -o addopts=""` runs the MoE GPU tests of tests/core/speed/moe and tests/kernels/moe.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One cache per test session (GGUF conversions, tokenized data), never the user's own.
os.environ.setdefault("HONE_CACHE", tempfile.mkdtemp(prefix="hone-test-cache-"))

import pytest

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark each test with its folders' names (tests/core/speed/attention/... -> core, speed, attention)."""
    registered = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    unregistered = set()
    for item in items:
        path = Path(item.path).resolve()
        if TESTS not in path.parents:
            continue
        folders = path.parent.relative_to(TESTS).parts
        for i, name in enumerate(folders):
            if name in registered:
                item.add_marker(name)
            else:
                unregistered.add("/".join(folders[: i + 1]))
    for folder in sorted(unregistered):
        name = folder.rsplit("/", 1)[-1]
        warnings.warn(
            pytest.PytestWarning(
                f'tests/{folder} has no area marker: add "{name}: <what it tests>" to markers in pyproject.toml\'s '
                f"[tool.pytest.ini_options] so `-m {name}` selects its tests"
            ),
            stacklevel=1,
        )


@functools.cache
def _fresh_process_threads() -> int:
    """The thread count torch starts with in a new process (as every `hone` process the tests start)."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    return int(out.stdout.strip())


@pytest.fixture(autouse=True)
def torch_threads_as_found():
    """A test that runs the Studio's in-window trainer sets torch's thread count for the whole process (a CPU run
    leaves the window a core): set it back, so later tests neither run on one core nor sum in another order than the
    `hone` processes they compare against. torch is not imported here for tests that never import it."""
    threads = _torch_threads()
    yield
    now = _torch_threads()
    if now is not None:
        wanted = threads if threads is not None else _fresh_process_threads()
        if now != wanted:
            sys.modules["torch"].set_num_threads(wanted)


def _torch_threads() -> int | None:
    """torch's thread count when torch is imported (and is torch: a test may stand a fake in for it), else None."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    return get() if callable(get) and callable(getattr(torch, "set_num_threads", None)) else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that fails while running kernels under Triton's interpreter skips, saying why, where that interpreter
    cannot run any kernel (tests/helpers/triton_interpreter.py); where it can, the failure stands."""
    try:
        return (yield)
    except Exception:
        if os.environ.get("TRITON_INTERPRET") == "1":
            from tests.helpers.triton_interpreter import interpreter_fault

            if fault := interpreter_fault():
                pytest.skip(fault)
        raise


# Qt's static dialogs wait for a user; offscreen, none comes and the suite would hang until CI's time limit. A test
# that reaches one without answering it (monkeypatch the dialog) fails at once, naming it.
_MODAL_DIALOGS = {
    "QMessageBox": ("question", "warning", "information", "critical"),
    "QInputDialog": ("getInt", "getDouble", "getText", "getItem"),
    "QFileDialog": ("getOpenFileName", "getOpenFileNames", "getSaveFileName", "getExistingDirectory"),
}


@pytest.fixture(autouse=True)
def _unanswered_dialogs_fail(monkeypatch):
    import sys

    widgets = sys.modules.get("PySide6.QtWidgets")
    if widgets is None:  # a test without Qt
        yield
        return
    for cls_name, names in _MODAL_DIALOGS.items():
        for name in names:

            def unanswered(*args, _where=f"{cls_name}.{name}", **kwargs):
                raise AssertionError(f"{_where} would wait for a user: the test must answer it (monkeypatch)")

            monkeypatch.setattr(getattr(widgets, cls_name), name, unanswered)
    yield


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
    """A folder holding SmolLM2-135M-Instruct's tokenizer (with its chat template), read from the bundled GGUF, or the
    folder named by HONE_TEST_TOKENIZER on machines without the bundled model (dev/export_test_tokenizer.py writes
    one)."""
    from transformers import AutoTokenizer

    from hone.core.resources import smollm2_gguf

    if os.environ.get("HONE_TEST_TOKENIZER"):
        return Path(os.environ["HONE_TEST_TOKENIZER"])
    gguf = smollm2_gguf()
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    """Factory: `tiny_model_dir("tiny-dense")` -> folder with a random-init model of that shape and the SmolLM2
    tokenizer, saved like any downloaded model (config.json, safetensors, tokenizer files)."""
    import shutil

    from hone.core.models.shapes import build_model

    made = {}

    def make(shape: str = "tiny-dense", seed: int = 0):
        key = (shape, seed)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"{shape}-{seed}")
            build_model(shape, seed=seed).save_pretrained(folder)
            for f in smollm2_tokenizer_dir.iterdir():
                shutil.copy(f, folder / f.name)
            made[key] = folder
        return made[key]

    return make

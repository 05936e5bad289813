"""Shared fixtures: the real SmolLM2 tokenizer (from the bundled GGUF, converted once and cached) and tiny
random-init models saved as real model folders, so tests go through the same loaders as users do.

No test downloads anything: HF_HUB_OFFLINE is set for the whole session.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One cache per test session (GGUF conversions, tokenized data), never the user's own.
os.environ.setdefault("HONE_CACHE", tempfile.mkdtemp(prefix="hone-test-cache-"))

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
    """A folder holding SmolLM2-135M-Instruct's tokenizer (with its chat template), read from the GGUF, or the folder
    named by HONE_TEST_TOKENIZER on machines without the bundled model (the GGUF is too large to copy everywhere)."""
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

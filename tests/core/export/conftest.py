"""Fixtures for the export tests: a tiny tokenizer, tiny base model folders, run folders, references."""

from __future__ import annotations

import shutil

import pytest
from export_helpers import TINY_SHAPES, TINY_VOCAB, Reference, build_tiny_tokenizer, write_run


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Factory: a saved tiny base model folder (random init, seed 0) with the tiny tokenizer."""
    made = {}

    def make(shape: str = "tiny-dense"):
        if shape not in made:
            from hone.core.models.shapes import build_model

            folder = tmp_path_factory.mktemp(shape)
            build_model(TINY_SHAPES[shape], seed=0, vocab_size=TINY_VOCAB).save_pretrained(folder)
            for f in tiny_tokenizer_dir.iterdir():
                shutil.copy(f, folder / f.name)
            made[shape] = folder
        return made[shape]

    return make


@pytest.fixture(scope="session")
def make_run(tmp_path_factory, base_model_dir):
    """Factory: a run folder with a random non-zero LoRA on a tiny base; cached per arguments."""
    made = {}

    def make(shape: str = "tiny-dense", **kwargs):
        key = (shape, tuple(sorted(kwargs.items())))
        if key not in made:
            run_dir = tmp_path_factory.mktemp(f"run-{shape}") / "run"
            made[key] = write_run(run_dir, str(base_model_dir(shape)), **kwargs)
        return made[key]

    return make


@pytest.fixture(scope="session")
def reference():
    return Reference

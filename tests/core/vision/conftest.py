"""Fixtures for the vision tests: tiny random-init models of each family with offline processors, and a mixed
dataset (text-only rows next to rows with one and two images)."""

from __future__ import annotations

import pytest
from vision_helpers import draw, reply, user

from hone.core.vision import tiny


@pytest.fixture(scope="session")
def vision_kit(smollm2_tokenizer_dir):
    """vision_kit(kind) -> (processor, model): the family's processor and a tiny random-init model (seed 0)."""
    made = {}

    def make(kind: str):
        if kind not in made:
            tokenizer = tiny.vision_tokenizer(kind, smollm2_tokenizer_dir)
            made[kind] = (tiny.build_processor(kind, tokenizer), tiny.build_vision_model(kind, tokenizer))
        return made[kind]

    return make


@pytest.fixture(scope="session")
def vision_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    """vision_model_dir(kind) -> a saved model folder (weights, tokenizer, image processor, chat template)."""
    made = {}

    def make(kind: str):
        if kind not in made:
            made[kind] = tiny.save_vision_model(tmp_path_factory.mktemp(f"tiny-{kind}"), kind, smollm2_tokenizer_dir)
        return made[kind]

    return make


@pytest.fixture(scope="session")
def mixed_rows(tmp_path_factory):
    """(folder, rows): a text-only row, a one-image row, a two-image row and a second text-only row (JSON-ready,
    image paths relative to the folder)."""
    folder = tmp_path_factory.mktemp("mixed")
    draw(folder / "red.png", (40, 30), "red", "circle")
    draw(folder / "blue.png", (64, 64), "blue")
    draw(folder / "green.png", (30, 50), "green", "circle")
    rows = [
        {"messages": [{"role": "user", "content": "What is the capital of France?"}, reply("Paris.")]},
        {"messages": [user("red.png", "What color is it?"), reply("red")]},
        {"messages": [user("Compare", "blue.png", "and", "green.png"), reply("a blue square and a green circle")]},
        {"messages": [{"role": "user", "content": "Say hi."}, reply("Hi!")]},
    ]
    return folder, rows

"""Fixtures for the core tests: a small chat dataset and a tiny-model run config."""

from __future__ import annotations

import json

import pytest

from hone.core.config import RunConfig
from hone.core.demo.text_data import make_dataset


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def chat_files(tmp_path_factory):
    """(train.jsonl, eval.jsonl): 24 and 4 chat rows of the demo task."""
    folder = tmp_path_factory.mktemp("chat")
    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    return write_rows(folder / "train.jsonl", train), write_rows(folder / "eval.jsonl", eval_rows)


def make_tiny_config(model_dir, chat_files, runs_dir, *overrides) -> RunConfig:
    train, eval_file = chat_files
    return RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(str(runs_dir))}",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=3",
            "train.lr=1e-3",
            "train.warmup_steps=1",
            *overrides,
        ]
    )


@pytest.fixture
def tiny_config():
    """tiny_config(model_dir, chat_files, runs_dir, "train.max_steps=5", ...) -> RunConfig for a CPU run."""
    return make_tiny_config

"""The tokenizer data checks use: `hone data check --model` and the Studio's Data page get the one training uses, for
every kind of model name, without reading (or converting) any weights."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from gguf import GGUFReader

from hone.core.cli.commands.data import load_tokenizer as data_check_tokenizer
from hone.core.config import DEMO_MODEL, DataConfig, ModelConfig
from hone.core.data import check_data
from hone.core.data.cache import tokenizer_fingerprint
from hone.core.errors import ModelError
from hone.core.models.load import gguf_folder, tokenizer_for
from hone.core.resources import smollm2_gguf

# The bundled samples: chat rows (rendered through the chat template) and plain-text rows (which end in EOS).
ROWS = ["bundled:samples/chat.jsonl", "bundled:samples/pretrain.jsonl"]


@functools.cache
def _gguf_fields() -> dict:
    """The bundled GGUF's metadata fields, read once (each read parses the whole 49k-token vocabulary: seconds)."""
    return GGUFReader(smollm2_gguf()).fields


def _gguf_token_id(key: str) -> int:
    """A special token's id as the GGUF file itself states it (the reference, read without transformers)."""
    field = _gguf_fields()[f"tokenizer.ggml.{key}_token_id"]
    return int(field.parts[field.data[0]][0])


@pytest.fixture(scope="module")
def unconverted(tmp_path_factory):
    """(tokenizer, cache): what `hone data check --model bundled:...` loads while the bundled GGUF was never
    converted (built from the GGUF's metadata; seconds, so built once for this module), and the empty cache it
    loaded with."""
    cache = tmp_path_factory.mktemp("unconverted") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HONE_CACHE", str(cache))
        return data_check_tokenizer(DEMO_MODEL), cache


def _token_ids(tokenizer, files: list[str]) -> list[list[int]]:
    _report, data = check_data(DataConfig(train=files, max_length=512), tokenizer)
    return [row.input_ids for row in data]


def test_data_page_and_data_check_tokenize_rows_alike(unconverted, monkeypatch):
    """Same ids for the same rows from both entry points, special tokens as the GGUF states them (transformers 5.17
    reads SmolLM2's EOS as <|im_start|>), and no GGUF conversion (that reads every weight)."""
    pytest.importorskip("PySide6")
    from hone.app.pages.data_check import load_tokenizer_for

    command, cache = unconverted
    monkeypatch.setenv("HONE_CACHE", str(cache))
    page = load_tokenizer_for(ModelConfig(name_or_path=DEMO_MODEL))
    chat, text = _token_ids(command, ROWS[:1]), _token_ids(command, ROWS[1:])
    assert len(chat) == 12 and len(text) == 6  # every sample row kept
    assert _token_ids(page, ROWS[:1]) == chat
    assert _token_ids(page, ROWS[1:]) == text
    eos, pad = _gguf_token_id("eos"), _gguf_token_id("padding")
    assert all(ids[-1] == eos for ids in text), "a plain-text row must end with the model's EOS"
    for tokenizer in (page, command):
        assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (eos, pad)
    assert not (cache / "models").exists(), "loading a tokenizer converted the GGUF (read all its weights)"


@pytest.mark.slow
def test_a_gguf_s_tokenizer_is_the_one_its_conversion_saves(unconverted):
    """Before a run converted the GGUF the tokenizer is built from its metadata; after, it is read from the converted
    folder a run trains from. Both are the same tokenizer (definition, special tokens, ids)."""
    from_metadata, _cache = unconverted  # tokenizer_for in a cache with no conversion in it
    model_cfg = ModelConfig(name_or_path=DEMO_MODEL)
    # What load_model trains from, in the test session's cache, where the bundled model is converted once (reads
    # every weight: slow the first time).
    folder = gguf_folder(smollm2_gguf())
    from_conversion = tokenizer_for(model_cfg)
    assert Path(from_conversion.name_or_path) == folder
    assert tokenizer_fingerprint(from_conversion) == tokenizer_fingerprint(from_metadata)
    assert from_conversion.pad_token_id == from_metadata.pad_token_id == _gguf_token_id("padding")
    assert _token_ids(from_conversion, ROWS) == _token_ids(from_metadata, ROWS)


def test_a_folder_of_tokenizer_files_is_read_as_it_is(smollm2_tokenizer_dir, smollm2_tokenizer, tmp_path):
    """What `hone data check --model` accepted before: a folder with tokenizer files and no model; padding is set as
    for a model."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(smollm2_tokenizer_dir, folder)
    tokenizer = data_check_tokenizer(str(folder))
    assert tokenizer.pad_token is not None
    assert _token_ids(tokenizer, ROWS) == _token_ids(smollm2_tokenizer, ROWS)


def test_a_folder_without_a_model_or_tokenizer_says_what_to_give(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelError, match=r"neither config\.json nor a \.gguf") as info:
        tokenizer_for(ModelConfig(name_or_path=str(tmp_path)))
    assert str(tmp_path) in info.value.message and info.value.advice


def test_a_broken_tokenizer_folder_names_the_folder(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{ not json")
    with pytest.raises(ModelError, match="cannot load the tokenizer in") as info:
        tokenizer_for(ModelConfig(name_or_path=str(tmp_path)))
    assert str(tmp_path) in info.value.message

"""The adapter folder is written beside the run's adapter and put in place whole: a full disk leaves the adapter
saved before as it was, no half-written folder, and a message that says the disk is full and how to go on."""

from __future__ import annotations

import errno

import pytest

from hone.core.config import RunConfig
from hone.core.errors import HoneError
from hone.core.train.adapter_dir import save_adapter
from tests.helpers.lora import lora_model


class _Tokenizer:
    """What save_adapter asks of a tokenizer: save its files, or find the disk full."""

    def __init__(self, full: bool = False):
        self.full = full

    def save_pretrained(self, folder):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "tokenizer.json"))
        (folder / "tokenizer.json").write_text("{}", encoding="utf-8")


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_full_disk_keeps_the_adapter_saved_before_and_says_so(tmp_path):
    model, config = lora_model(vocab=64), RunConfig()
    run = tmp_path / "run"
    first = save_adapter(model, _Tokenizer(), run / "adapter", config, steps=2, final_loss=1.0)
    assert sorted(p.name for p in run.iterdir()) == ["adapter"]
    before = _files(first)
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "README.md"} <= set(before)

    with pytest.raises(HoneError) as e:
        save_adapter(model, _Tokenizer(full=True), run / "adapter", config, steps=4, final_loss=0.5)
    assert e.value.message.startswith(f"the disk is full: the adapter could not be written in {run}")
    assert "hone train --resume" in e.value.advice
    assert sorted(p.name for p in run.iterdir()) == ["adapter"]  # no staging folder left behind
    assert _files(run / "adapter") == before

    save_adapter(model, _Tokenizer(), run / "adapter", config, steps=4, final_loss=0.5)  # room again: replaced
    assert "| steps | 4 |" in (run / "adapter" / "README.md").read_text()
    assert sorted(p.name for p in run.iterdir()) == ["adapter"]

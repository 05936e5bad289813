"""An optimizer or QLoRA that needs bitsandbytes, asked for where it is missing: the advice names Hone's gpu extra."""

from __future__ import annotations

import sys

import pytest
import torch

from hone.core.config import TrainConfig
from hone.core.errors import ConfigError, ModelError
from hone.core.models.load import _qlora_config
from hone.core.train.optim import build_optimizer


@pytest.fixture
def no_bitsandbytes(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` raises ImportError


def test_the_8bit_optimizer_without_bitsandbytes_says_how_to_add_it(no_bitsandbytes):
    params = [torch.nn.Parameter(torch.zeros(4))]
    with pytest.raises(ConfigError) as e:
        build_optimizer(params, TrainConfig(optimizer="adamw8bit"), "cuda")
    assert 'pip install "hone-studio[gpu]"' in e.value.advice


def test_qlora_without_bitsandbytes_says_how_to_add_it(no_bitsandbytes):
    with pytest.raises(ModelError) as e:
        _qlora_config(torch.bfloat16, "cuda")
    assert 'pip install "hone-studio[gpu]"' in e.value.advice and "lora.qlora off" in e.value.advice

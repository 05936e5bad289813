"""Parameter counts as users think of them: a 4-bit weight counts the values it stands for, whatever packs it."""

from __future__ import annotations

import pytest
import torch

from hone.core.bench.weights import active_params
from hone.core.models.load import count_params, logical_numel

bnb = pytest.importorskip("bitsandbytes")


def quantized_linear(storage: torch.dtype) -> torch.nn.Module:
    layer = bnb.nn.Linear4bit(32, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4", quant_storage=storage)
    layer.weight = bnb.nn.Params4bit(
        torch.randn(64, 32, dtype=torch.bfloat16), requires_grad=False, quant_type="nf4", quant_storage=storage
    )
    return layer.to("cpu")  # quantizes


@pytest.mark.parametrize("storage", [torch.bfloat16, torch.uint8])
def test_a_4bit_weight_counts_its_unpacked_shape(storage):
    layer = quantized_linear(storage)
    assert layer.weight.numel() < 64 * 32  # packed: 4 values per bf16 element, 2 per byte
    assert logical_numel(layer.weight) == 64 * 32


def test_models_count_4bit_and_plain_weights_alike():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), quantized_linear(torch.bfloat16))
    assert count_params(model) == 100 * 32 + 64 * 32
    assert active_params(model, experts=0, experts_per_token=0) == 100 * 32 + 64 * 32


def test_a_weight_not_yet_quantized_counts_as_it_is():
    weight = bnb.nn.Params4bit(torch.randn(64, 32, dtype=torch.bfloat16), requires_grad=False, quant_type="nf4")
    assert logical_numel(weight) == 64 * 32

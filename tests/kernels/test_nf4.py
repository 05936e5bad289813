"""NF4 dequantize (kernel under Triton's interpreter, and its torch reference) against bitsandbytes itself."""

from __future__ import annotations

import pytest
import torch

from hone.kernels.lora_linear import lora_linear
from hone.kernels.nf4 import NF4Weight
from hone.kernels.reference import NF4_CODE

bnb = pytest.importorskip("bitsandbytes")
bnb_functional = pytest.importorskip("bitsandbytes.functional")

# (out, in): odd element count (last byte half used), a single row, several 64-blocks and a partial one, and
# more than 256 blocks so double quantization's second level has two scales.
SHAPES = [(7, 9), (1, 64), (64, 130), (160, 128)]


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # bitsandbytes' generic dequantize (used for odd shapes) is wrapped in torch.compile; run it eagerly (same
    # numerics) instead of spending seconds compiling it on a CPU.
    with torch._dynamo.config.patch(disable=True):
        yield


def _quantized(shape, nested: bool, seed: int = 0) -> bnb.nn.Params4bit:
    g = torch.Generator().manual_seed(seed)
    weight = 0.05 * torch.randn(shape, generator=g)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, compress_statistics=nested, quant_type="nf4")
    return bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, bnb_quantized=True)


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    return x.abs().float() * 2.0**-7 + 1e-30


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_dequantize_matches_bitsandbytes(shape, nested):
    param = _quantized(shape, nested)
    state = param.quant_state
    assert state.nested == nested and torch.allclose(state.code, torch.tensor(NF4_CODE))
    weight = NF4Weight.from_params4bit(param)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        state.dtype = dtype
        expected = bnb_functional.dequantize_4bit(param.data, state)
        got = weight.dequantize(dtype)
        assert got.shape == expected.shape == shape and got.dtype == expected.dtype == dtype
        if dtype == torch.bfloat16:
            # The interpreter rounds fp32 -> bf16 toward zero (CUDA rounds to nearest): within one bf16 unit.
            assert ((got.float() - expected.float()).abs() <= _bf16_ulp(expected)).all(), (shape, nested)
        else:
            assert torch.equal(got, expected), (
                f"{shape} nested={nested} {dtype}: max diff {(got.float() - expected.float()).abs().max().item():.3g}"
            )


@pytest.mark.parametrize("nested", [True, False])
def test_reference_dequantize_is_bit_exact(monkeypatch, nested):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the torch fallback path
    param = _quantized((64, 130), nested, seed=1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        param.quant_state.dtype = dtype
        expected = bnb_functional.dequantize_4bit(param.data, param.quant_state)
        assert torch.equal(NF4Weight.from_params4bit(param).dequantize(dtype), expected), dtype


def test_nf4_linear_matches_bitsandbytes_linear4bit():
    """Base matmul of the QLoRA path (LoRA scale 0) against bnb's own Linear4bit: values and input gradient."""
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(
        130, 24, bias=True, compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True
    )
    layer.weight = bnb.nn.Params4bit(
        0.05 * torch.randn(24, 130), requires_grad=False, quant_type="nf4", compress_statistics=True
    )
    layer = layer.to("cpu")
    layer.bias.requires_grad_(False)
    x = torch.randn(3, 5, 130, requires_grad=True)
    expected = layer(x)
    (dx_expected,) = torch.autograd.grad(expected.sum(), (x,))
    zeros_a, zeros_b = torch.zeros(4, 130, requires_grad=True), torch.zeros(24, 4, requires_grad=True)
    got = lora_linear(x, zeros_a, zeros_b, 1.0, nf4=NF4Weight.from_params4bit(layer.weight), bias=layer.bias)
    (dx,) = torch.autograd.grad(got.sum(), (x,))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, dx_expected, atol=1e-5, rtol=1e-5)

"""The QLoRA round trip of the merged export (`qlora_round_trip`): nf4 quantization as bitsandbytes' CUDA kernels do
it, dequantized by Hone's nf4 reference, so the merged base equals the weights training computed with.

The tiny Llama's layer-0 gate_proj is a case bitsandbytes' CPU quantizer gets wrong: three of its block scales,
less their mean and divided by their absmax, sit 5.6e-6 past the midpoint between two 8-bit codes, and the CPU
quantizer (a 65536-entry lookup table) takes the farther code, putting 0.52% of the weights one bf16 step off.
"""

from __future__ import annotations

import pytest
import torch
from export_helpers import TINY_SHAPES, TINY_VOCAB

from hone.core.export.merge import qlora_round_trip
from hone.core.models.shapes import build_model
from hone.kernels.reference import (
    NF4_CODE,
    dynamic_code_index,
    nf4_absmax_reference,
    nf4_dequantize_reference,
    nf4_quantize_reference,
)

bnbf = pytest.importorskip("bitsandbytes.functional")

# bitsandbytes' CPU quantizer reads its codes from a table over [-1, 1] in 65535 steps
LUT_STEP = 2 / 65535


@pytest.fixture(scope="module")
def tiny_llama():
    """(name, bf16 weight) for every Linear QLoRA quantizes, and the model put through the round trip."""
    model = build_model(TINY_SHAPES["tiny-llama"], seed=0, vocab_size=TINY_VOCAB)
    output = model.get_output_embeddings()
    weights = {
        name: module.weight.detach().to(torch.bfloat16).clone()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    }
    assert qlora_round_trip(model, "bfloat16") == len(weights)
    return weights, model


def _nearest(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the code entry nearest each value, in float64 (the CUDA kernels' rule, without their search)."""
    return (x.double().unsqueeze(-1) - code.double()).abs().argmin(-1)


def _by_nearest_codes(weight: torch.Tensor) -> torch.Tensor:
    """nf4 with double quantization written plainly: each value and each centred scale to its nearest code (fp32
    scaling by the reciprocal, as the kernels scale), dequantized by Hone's reference. Returns bf16."""
    code, scale_code = torch.tensor(NF4_CODE), bnbf.create_dynamic_map().float()
    blocks = weight.float().reshape(-1, 64)
    absmax = blocks.abs().amax(1)
    nibbles = _nearest(blocks * (1.0 / absmax)[:, None], code).reshape(-1).to(torch.uint8)
    packed = (nibbles[0::2] << 4) | nibbles[1::2]
    offset = absmax.mean()
    centred = torch.nn.functional.pad(absmax - offset, (0, -absmax.numel() % 256)).view(-1, 256)
    absmax2 = centred.abs().amax(1)
    q = _nearest(centred * (1.0 / absmax2)[:, None], scale_code).reshape(-1)[: absmax.numel()].to(torch.uint8)
    scales = nf4_absmax_reference(q, absmax2, scale_code, offset, 256)
    return nf4_dequantize_reference(packed, scales, code, 64, tuple(weight.shape), torch.bfloat16)


def test_round_trip_quantizes_each_value_and_scale_to_its_nearest_code(tiny_llama):
    weights, model = tiny_llama
    for name, weight in weights.items():
        got = model.get_submodule(name).weight.detach()
        want = _by_nearest_codes(weight).float()
        differing = got.ne(want)
        assert not differing.any(), (
            f"{name}: {differing.float().mean():.2%} of weights differ (max "
            f"{(got - want).abs().max():.3g}) from nf4 by nearest codes"
        )
    # the case bitsandbytes' CPU quantizer got wrong is in this model: a centred scale nearer a code midpoint than
    # its lookup table resolves
    absmax = weights["model.layers.0.mlp.gate_proj"].float().reshape(-1, 64).abs().amax(1)
    centred = absmax - absmax.mean()
    x = (centred * (1.0 / centred.abs().max())).double()
    scale_code = bnbf.create_dynamic_map().double()
    midpoints = (scale_code[:-1] + scale_code[1:]) / 2
    assert (x.unsqueeze(-1) - midpoints).abs().min() < LUT_STEP / 4


def test_round_trip_equals_hone_dequantize_of_the_quantized_state(tiny_llama, monkeypatch):
    """The round trip's weights are Hone's nf4 dequantize (reference and, interpreted, the Triton kernel training
    runs) of the state `nf4_quantize_reference` makes, bit for bit; bitsandbytes reads that state to the same
    weights."""
    from hone.kernels.nf4 import NF4Weight

    weights, model = tiny_llama
    scale_code = bnbf.create_dynamic_map().float()
    for i, (name, weight) in enumerate(weights.items()):
        state = nf4_quantize_reference(weight, scale_code)
        nf4 = NF4Weight(
            packed=state.packed,
            absmax=state.scale_codes,
            code=state.code,
            shape=state.shape,
            dtype=torch.bfloat16,
            blocksize=64,
            absmax2=state.scale_absmax,
            code2=state.scale_code,
            offset=state.offset,
            blocksize2=256,
        )
        got = model.get_submodule(name).weight.detach()
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert torch.equal(got, nf4.dequantize().float()), f"{name}: differs from Hone's nf4 reference"
        if i < 2:
            # the Triton kernel under the interpreter (slow, so on two weights), in fp32: the interpreter rounds
            # fp32 -> bf16 toward zero where CUDA rounds to nearest, so the bf16 rounding is torch's here
            monkeypatch.setenv("TRITON_INTERPRET", "1")
            kernel = nf4.dequantize(torch.float32)
            assert torch.equal(got, kernel.to(torch.bfloat16).float()), f"{name}: differs from Hone's nf4 kernel"
        quant_state = bnbf.QuantState(
            absmax=state.scale_codes,
            shape=weight.shape,
            dtype=torch.bfloat16,
            blocksize=64,
            code=state.code,
            quant_type="nf4",
            offset=state.offset,
            state2=bnbf.QuantState(
                absmax=state.scale_absmax, code=state.scale_code, blocksize=256, dtype=torch.float32
            ),
        )
        assert torch.equal(got, bnbf.dequantize_4bit(state.packed, quant_state).float()), name


def test_scale_codes_are_the_nearest_entries_even_next_to_a_midpoint():
    """`dQuantize`'s binary search gives the nearest entry of the dynamic map, also 2 fp32 ulps either side of a
    midpoint between two entries (where an fp32 midpoint cannot be on the wrong side) and a quarter lookup-table
    step either side of it."""
    code = bnbf.create_dynamic_map().float()
    midpoints = ((code[:-1].double() + code[1:].double()) / 2).float()
    ulp = torch.nextafter(midpoints, torch.full_like(midpoints, 2.0)) - midpoints
    near = [midpoints + 2 * ulp, midpoints - 2 * ulp, midpoints + LUT_STEP / 4, midpoints - LUT_STEP / 4]
    x = torch.cat([*near, torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 2 - 1, code]).clamp(-1, 1)
    got = dynamic_code_index(x, code).long()
    want = _nearest(x, code)
    # where two entries are equally near (only the code's own duplicate zeros) either is right
    tied = (x.double() - code[got].double()).abs() == (x.double() - code[want].double()).abs()
    assert (got.eq(want) | tied).all(), x[~(got.eq(want) | tied)]


def test_nibbles_follow_the_kernel_thresholds_and_a_zero_block_gets_code_zero():
    """dQuantizeNF4's thresholds are the code book's fp32 midpoints; an all-zero block (0 * 1/0 = NaN) passes none
    of them, as in the kernel: code 0."""
    thresholds = (
        -0.8480964004993439,
        -0.6106329262256622,
        -0.4599952697753906,
        -0.33967943489551544,
        -0.23460740596055984,
        -0.13791173323988914,
        -0.045525018125772476,
        0.03979014977812767,
        0.1202552504837513,
        0.2035212516784668,
        0.2920137718319893,
        0.3893125355243683,
        0.5016634166240692,
        0.6427869200706482,
        0.8614784181118011,
    )  # csrc/kernels.cu, dQuantizeNF4
    code = torch.tensor(NF4_CODE)
    assert torch.equal((code[:-1] + code[1:]) / 2, torch.tensor(thresholds))
    weight = (0.02 * torch.randn(3, 128, generator=torch.Generator().manual_seed(1))).to(torch.bfloat16)
    weight[1, :64] = 0
    state = nf4_quantize_reference(weight, bnbf.create_dynamic_map().float())
    nibbles = torch.stack((state.packed >> 4, state.packed & 0xF), 1).reshape(-1).long()
    assert nibbles[128:192].eq(0).all()
    scaled = weight.float().reshape(-1, 64) * (1.0 / weight.float().reshape(-1, 64).abs().amax(1, keepdim=True))
    want = (scaled.unsqueeze(-1) > torch.tensor(thresholds)).sum(-1).reshape(-1)
    assert torch.equal(nibbles[:128], want[:128]) and torch.equal(nibbles[192:], want[192:])

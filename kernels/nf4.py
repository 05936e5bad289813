"""NF4 (QLoRA) dequantize in Triton, bit-for-bit with bitsandbytes' `dequantize_4bit`.

Naming chain: `_nf4_dequantize_kernel` (Triton) -> `nf4_dequantize_forward` (launcher) -> `NF4Weight.dequantize`
(entry, with the torch fallback). There is no autograd Function: the base weight is frozen; the LoRA linear
(`hone.kernels.lora_linear`) calls `dequantize` in forward and again in backward instead of keeping a 16-bit copy
(the matmul, not the dequantize, is where the time goes: docs/performance/dense.md, QLoRA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hone.kernels._runtime import cdiv, compile_options, launcher, use_triton
from hone.kernels._triton import tl, triton
from hone.kernels.reference import nf4_absmax_reference, nf4_dequantize_reference

# Bytes per program: 2048 outputs (4 KB of bf16) over 4 warps is 16 values per thread, wide enough for full
# 16-byte stores while the gathers into the 16-entry code book stay in L1.
_BLOCK_BYTES = 1024
_NUM_WARPS = 4


@triton.jit
def _nf4_dequantize_kernel(
    packed_ptr,
    absmax_ptr,
    code_ptr,
    absmax2_ptr,
    code2_ptr,
    offset_ptr,
    out_ptr,
    n_bytes,
    numel,
    BLOCKSIZE: tl.constexpr,
    BLOCKSIZE2: tl.constexpr,
    NESTED: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
):
    byte = (tl.program_id(0) * BLOCK_BYTES + tl.arange(0, BLOCK_BYTES)).to(tl.int64)
    byte_mask = byte < n_bytes
    packed = tl.load(packed_ptr + byte, mask=byte_mask, other=0)
    high = tl.load(code_ptr + (packed >> 4).to(tl.int32), mask=byte_mask, other=0.0)
    low = tl.load(code_ptr + (packed & 0xF).to(tl.int32), mask=byte_mask, other=0.0)
    block = (byte * 2) // BLOCKSIZE  # both nibbles of a byte share a block: block sizes are even
    if NESTED:
        q = tl.load(absmax_ptr + block, mask=byte_mask, other=0).to(tl.int32)
        scale = tl.load(code2_ptr + q, mask=byte_mask, other=0.0) * tl.load(
            absmax2_ptr + block // BLOCKSIZE2, mask=byte_mask, other=0.0
        )
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block, mask=byte_mask, other=0.0)
    values = tl.reshape(tl.join(high * scale, low * scale), [2 * BLOCK_BYTES])
    index = tl.reshape(tl.join(byte * 2, byte * 2 + 1), [2 * BLOCK_BYTES])
    tl.store(out_ptr + index, values.to(out_ptr.dtype.element_ty), mask=index < numel)


@dataclass
class NF4Weight:
    """A bitsandbytes nf4 weight as plain tensors (no bitsandbytes import needed to use it).

    Layout (bitsandbytes `Params4bit`): two 4-bit codes per byte, high nibble first, over the row-major (out, in)
    weight; one scale per `blocksize` (64) elements. With double quantization the scales are themselves uint8
    codes into a 256-entry table, scaled per 256 blocks, plus one fp32 offset:
    `scale[i] = code2[absmax[i]] * absmax2[i // 256] + offset`.

    Attributes:
        packed: uint8 bytes (any storage dtype; viewed as bytes), ceil(out * in / 2) of them.
        absmax: per-block scales: fp32, or uint8 codes when `nested`.
        code: (16,) fp32 nf4 code book.
        shape: (out_features, in_features).
        dtype: the dtype the weight is dequantized to by default (bitsandbytes' `quant_state.dtype`).
        blocksize: elements per scale (64 for QLoRA).
        absmax2, code2, offset, blocksize2: the second-level state when `nested` (double quantization).
    """

    packed: torch.Tensor
    absmax: torch.Tensor
    code: torch.Tensor
    shape: tuple[int, int]
    dtype: torch.dtype
    blocksize: int = 64
    absmax2: torch.Tensor | None = None
    code2: torch.Tensor | None = None
    offset: torch.Tensor | None = None
    blocksize2: int = 256

    @property
    def nested(self) -> bool:
        return self.absmax2 is not None

    @classmethod
    def from_params4bit(cls, weight) -> NF4Weight:
        """Wrap a bitsandbytes `Params4bit` (reads `.data` and `.quant_state`; nothing is copied)."""
        state = weight.quant_state
        nested = getattr(state, "nested", False)
        state2 = state.state2 if nested else None
        return cls(
            packed=weight.data,
            absmax=state.absmax,
            code=state.code,
            shape=tuple(state.shape),
            dtype=state.dtype,
            blocksize=state.blocksize,
            absmax2=state2.absmax if nested else None,
            code2=state2.code if nested else None,
            offset=state.offset if nested else None,
            blocksize2=state2.blocksize if nested else 256,
        )

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The (out, in) weight in `dtype` (default: `self.dtype`)."""
        dtype = dtype or self.dtype
        if use_triton(self.packed, self.absmax, self.code):
            return nf4_dequantize_forward(self, dtype)
        absmax = nf4_absmax_reference(self.absmax, self.absmax2, self.code2, self.offset, self.blocksize2)
        return nf4_dequantize_reference(self.packed, absmax, self.code, self.blocksize, self.shape, dtype)


def nf4_dequantize_forward(weight: NF4Weight, dtype: torch.dtype) -> torch.Tensor:
    """Launch the dequantize kernel; returns a new (out, in) tensor of `dtype`.

    All arithmetic is fp32 in the same order as bitsandbytes, rounded once to the output dtype. One program reads
    1024 packed bytes and writes 2048 weights; the dequantized weight then feeds cuBLAS.
    """
    numel = math.prod(weight.shape)
    packed = weight.packed.reshape(-1).view(torch.uint8)
    n_bytes = (numel + 1) // 2
    out = torch.empty(weight.shape, dtype=dtype, device=packed.device)
    nested = weight.nested
    launcher(_nf4_dequantize_kernel, packed.device)[(cdiv(n_bytes, _BLOCK_BYTES),)](
        packed,
        weight.absmax,
        weight.code,
        weight.absmax2 if nested else weight.absmax,
        weight.code2 if nested else weight.code,
        weight.offset if nested else weight.absmax,
        out,
        n_bytes,
        numel,
        BLOCKSIZE=weight.blocksize,
        BLOCKSIZE2=weight.blocksize2,
        NESTED=nested,
        BLOCK_BYTES=_BLOCK_BYTES,
        num_warps=_NUM_WARPS,
        # bitsandbytes multiplies then adds the offset in two roundings; a fused multiply-add would differ in
        # the last fp32 bit.
        **compile_options(packed.device, enable_fp_fusion=False),
    )
    return out

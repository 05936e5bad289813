"""Plain-torch references for Hone's kernels.

Each function computes exactly what the transformers / peft / bitsandbytes code it stands for computes, with the
same intermediate roundings, so tests can hold a kernel to it and the fused paths can fall back to it (on CPU,
inside `torch.compile`, or where Triton is missing). Autograd differentiates these directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

NORM_STYLES = ("llama", "gemma")
GLU_ACTIVATIONS = ("silu", "gelu_tanh", "gelu")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, style: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension.

    Args:
        x: (..., N) activations, any float dtype.
        weight: (N,) scale.
        eps: added to the mean square.
        style: "llama" (Llama, Mistral, Qwen2/3): `weight * normed.to(x.dtype)`, result dtype promoted from
            both; "gemma" (Gemma 1/2/3): `(normed * (1 + weight.float())).to(x.dtype)`.

    Returns:
        (..., N) normalized activations.
    """
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if style == "gemma":
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


def add_rms_norm_reference(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, style: str = "llama"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's `h = residual + x` followed by RMSNorm of `h`.

    Returns:
        (h, rms_norm(h)): the new residual stream (dtype of the inputs) and its normalized copy.
    """
    h = residual + x
    return h, rms_norm_reference(h, weight, eps, style)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, transformers' `apply_rotary_pos_emb` (half-split rotation).

    Args:
        q: (B, Hq, S, D) queries (or (B, S, Hq, D) with `unsqueeze_dim=2`).
        k: (B, Hk, S, D) keys, same layout.
        cos, sin: (B or 1, S, D), already gathered at each token's position id (packed rows restart at 0).

    Returns:
        The rotated (q, k), new tensors.
    """
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def activation_reference(x: torch.Tensor, activation: str) -> torch.Tensor:
    """silu, gelu with the tanh approximation (`gelu_pytorch_tanh` / `gelu_new`), or exact (erf) gelu."""
    if activation == "silu":
        return F.silu(x)
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "gelu":
        return F.gelu(x)
    raise ValueError(f"unknown activation {activation!r}; expected one of {GLU_ACTIVATIONS}")


def glu_reference(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The gated MLP's middle: `act(gate) * up` (SwiGLU for silu, GeGLU for gelu). Shapes (..., I)."""
    return activation_reference(gate, activation) * up


def lora_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    dropout=None,
) -> torch.Tensor:
    """peft's `lora.Linear` forward for one adapter: `base(x) + B(A(dropout(x))) * scaling`.

    Args:
        x: (..., K) input.
        weight: (N, K) frozen base weight; bias: (N,) or None.
        lora_a: (r, K); lora_b: (N, r). The LoRA input is cast to their dtype, as peft does.
        scaling: alpha / r (or alpha / sqrt(r) with rsLoRA).
        dropout: a callable applied to the LoRA input (peft's `lora_dropout` module), or None.

    Returns:
        (..., N) in the base output's dtype.
    """
    result = F.linear(x, weight, bias)
    xl = x.to(lora_a.dtype)
    if dropout is not None:
        xl = dropout(xl)
    return (result + F.linear(F.linear(xl, lora_a), lora_b) * scaling).to(result.dtype)


# NF4 code book, as bitsandbytes defines it (normal-float quantiles; index 7 is exactly zero).
NF4_CODE = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def nf4_absmax_reference(
    absmax: torch.Tensor,
    nested_absmax: torch.Tensor | None = None,
    nested_code: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    nested_blocksize: int = 256,
) -> torch.Tensor:
    """Per-block fp32 scales; with double quantization `code2[absmax_u8] * absmax2[i // 256] + offset`."""
    if nested_absmax is None:
        return absmax.float()
    scales = nested_code[absmax.long()] * nested_absmax.repeat_interleave(nested_blocksize)[: absmax.numel()]
    return scales + offset


def nf4_dequantize_reference(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    code: torch.Tensor,
    blocksize: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """bitsandbytes' 4-bit dequantize: two codes per byte (high nibble first), scaled per block in fp32.

    Args:
        packed: uint8 (or another storage dtype viewed as bytes), ceil(numel / 2) bytes.
        absmax: fp32 per-block scales (already de-nested, see `nf4_absmax_reference`).
        code: (16,) fp32 code book.
        blocksize: elements per scale.
        shape: the weight's shape, e.g. (out_features, in_features).
        dtype: output dtype; values are computed in fp32 and rounded once.
    """
    numel = math.prod(shape)
    flat = packed.reshape(-1).view(torch.uint8)
    idx = torch.stack((flat >> 4, flat & 0xF), dim=1).reshape(-1)[:numel].long()
    values = code.float()[idx]
    scales = absmax.float().repeat_interleave(blocksize)[:numel]
    return (values * scales).reshape(shape).to(dtype)


@dataclass
class NF4Quantized:
    """A weight quantized to nf4 with double quantization, in bitsandbytes' layout (see `hone.kernels.nf4`).

    Attributes:
        packed: uint8, ceil(numel / 2): two 4-bit codes per byte, high nibble first, over the row-major weight.
        scale_codes: uint8, one per 64-weight block: the block's scale as an index into `scale_code`.
        scale_absmax: fp32, one per 256 blocks; offset: fp32 scalar (the mean of the blocks' absmax).
        code: (16,) fp32 nf4 code book; scale_code: (256,) fp32 bitsandbytes dynamic map.
        shape: the weight's shape; blocksize / scale_blocksize: weights per scale, scales per 8-bit group.
    """

    packed: Any
    scale_codes: Any
    scale_absmax: Any
    offset: Any
    code: Any
    scale_code: Any
    shape: tuple[int, ...]
    blocksize: int = 64
    scale_blocksize: int = 256

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`, by Hone's nf4 reference (`scale = scale_code[q] * absmax2 + offset`, then
        `code[nibble] * scale` in fp32, rounded once): what QLoRA training computed with."""
        scales = nf4_absmax_reference(
            self.scale_codes, self.scale_absmax, self.scale_code, self.offset, self.scale_blocksize
        )
        return nf4_dequantize_reference(self.packed, scales, self.code, self.blocksize, self.shape, dtype)


def dynamic_code_index(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """bitsandbytes' CUDA `dQuantize<0>` on fp32 `x` in [-1, 1]: binary search of the sorted (256,) `code`, then the
    nearer of the two entries around x by their fp32 midpoint. Returns uint8 indices, shaped like x."""
    pivot = torch.full(x.shape, 127, dtype=torch.int64)
    lower_i, upper_i = torch.zeros_like(pivot), torch.full_like(pivot, 255)
    lower, upper = torch.full_like(x, -1.0), torch.full_like(x, 1.0)
    val = code[pivot]
    for step in (64, 32, 16, 8, 4, 2, 1):
        above = x > val
        lower_i, lower = torch.where(above, pivot, lower_i), torch.where(above, val, lower)
        upper_i, upper = torch.where(above, upper_i, pivot), torch.where(above, upper, val)
        pivot = torch.where(above, pivot + step, pivot - step)
        val = code[pivot]
    upper = torch.where(upper_i == 255, code[255], upper)
    lower = torch.where(lower_i == 0, code[0], lower)
    up = torch.where(x > (upper + val) * 0.5, upper_i, pivot)
    down = torch.where(x < (lower + val) * 0.5, lower_i, pivot)
    return torch.where(x > val, up, down).to(torch.uint8)


def nf4_quantize_reference(
    weight: torch.Tensor, scale_code: torch.Tensor, blocksize: int = 64, scale_blocksize: int = 256
) -> NF4Quantized:
    """Quantize a 16-bit weight to nf4 with double quantization exactly as bitsandbytes' CUDA kernels do
    (`quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)` on a GPU, which is how QLoRA
    loading quantized the base that training saw).

    bitsandbytes' CPU quantizer is not that: it picks each block's 8-bit scale code through a 65536-entry lookup
    table (steps of 3e-5 over [-1, 1]), so a scale closer than that to a midpoint between two codes can get the
    farther one, and every weight of that block lands a bf16 step off what training used. Here every step is the
    CUDA kernels' (`kQuantizeBlockwise`, `dQuantizeNF4`, `dQuantize` in bitsandbytes' csrc/kernels.cu), in fp32
    torch ops. The one value that may still differ is the offset, a float32 mean that CUDA sums in another order;
    an offset one ulp apart moves a few weights in 100,000 by one bf16 step.

    Args:
        weight: any shape, bf16 or fp16 (the QLoRA compute dtype), on the CPU.
        scale_code: (256,) fp32 bitsandbytes dynamic map (`bitsandbytes.functional.create_dynamic_map()`).
    """
    code = torch.tensor(NF4_CODE, dtype=torch.float32)
    flat = weight.detach().reshape(-1).float()
    numel = flat.numel()
    blocks = F.pad(flat, (0, -numel % blocksize)).view(-1, blocksize)
    absmax = blocks.abs().amax(dim=1)
    scaled = blocks * (1.0 / absmax).unsqueeze(1)  # the kernel multiplies by the reciprocal; it does not divide
    # dQuantizeNF4's decision tree: code k when x is above k of the code book's fp32 midpoints (its thresholds);
    # an all-zero block gives NaN, which passes no threshold: code 0
    nibbles = torch.bucketize(scaled, (code[:-1] + code[1:]) / 2, out_int32=True)
    nibbles = nibbles.masked_fill_(scaled.isnan(), 0).to(torch.uint8).reshape(-1)[: numel + numel % 2]
    packed = (nibbles[0::2] << 4) | nibbles[1::2]
    offset = absmax.mean()
    centred = absmax - offset
    groups = F.pad(centred, (0, -centred.numel() % scale_blocksize)).view(-1, scale_blocksize)
    scale_absmax = groups.abs().amax(dim=1)
    scale_codes = dynamic_code_index(groups * (1.0 / scale_absmax).unsqueeze(1), scale_code)
    return NF4Quantized(
        packed=packed,
        scale_codes=scale_codes.reshape(-1)[: centred.numel()],
        scale_absmax=scale_absmax,
        offset=offset,
        code=code,
        scale_code=scale_code,
        shape=tuple(weight.shape),
        blocksize=blocksize,
        scale_blocksize=scale_blocksize,
    )

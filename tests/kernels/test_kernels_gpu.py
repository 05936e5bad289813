"""The compiled Triton kernels on a CUDA GPU against their torch references (run with `pytest -m gpu`).

The CPU tests run the same kernels in Triton's interpreter; these check what the compiler makes of them, at
Qwen3-8B-like widths, with the GPU's round-to-nearest bf16 (tighter than the interpreter's truncation).
"""

from __future__ import annotations

import json

import pytest
import torch

from hone.kernels.glu import glu
from hone.kernels.lora_linear import lora_linear
from hone.kernels.nf4 import NF4Weight
from hone.kernels.reference import (
    NF4_CODE,
    add_rms_norm_reference,
    glu_reference,
    lora_linear_reference,
    nf4_absmax_reference,
    nf4_dequantize_reference,
    rms_norm_reference,
    rope_reference,
)
from hone.kernels.rms_norm import add_rms_norm, rms_norm
from hone.kernels.rope import apply_rotary

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=4e-3, rtol=4e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=1.6e-2),
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _close(got, want, dtype, what, scale: float = 1.0):
    tol = {k: v * scale for k, v in TOL[dtype].items()}
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{what} ({dtype}): {m}")


def _randn(*shape, dtype, scale=1.0, grad=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, device="cuda", generator=g)).to(dtype).requires_grad_(grad)


# Each distinct (dtype, width, style) compiles its own kernels: the grid covers every width class in bf16 and
# the other dtypes at the hidden width, to keep the GPU suite's compile time short.
RMS_CASES = (
    [
        (rows, hidden, torch.bfloat16, style)
        for rows, hidden in [(1, 4096), (4099, 4096), (777, 1000), (2048 * 32, 128), (3, 16384)]
        for style in ("llama", "gemma")
    ]
    + [(4099, 4096, dtype, "llama") for dtype in (torch.float32, torch.float16)]
    + [(2048 * 32, 128, torch.float32, "gemma")]
)


@pytest.mark.parametrize(("rows", "hidden", "dtype", "style"), RMS_CASES)
def test_rms_norm(rows, hidden, dtype, style):
    x = _randn(rows, hidden, dtype=dtype)
    w = (_randn(hidden, dtype=torch.float32, scale=0.3, seed=1).detach() + (style == "llama")).to(dtype)
    w.requires_grad_()
    dy = _randn(rows, hidden, dtype=dtype, grad=False, seed=2)
    y, y_ref = rms_norm(x, w, 1e-6, style), rms_norm_reference(x, w, 1e-6, style)
    assert type(y.grad_fn).__name__ == "RMSNormFunctionBackward"
    _close(y, y_ref, dtype, f"rms_norm {style} {rows}x{hidden}")
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), dy)
    _close(dx, dx_ref, dtype, "dx")
    # dw sums over all rows (the reference in the activation dtype): compare as a whole, relative to its norm.
    err = ((dw.float() - dw_ref.float()).norm() / dw_ref.float().norm()).item()
    assert err < {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype], f"dw relative error {err}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_add_rms_norm(dtype):
    residual, x = _randn(4097, 4096, dtype=dtype), _randn(4097, 4096, dtype=dtype, seed=1)
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    dh, dy = _randn(4097, 4096, dtype=dtype, grad=False, seed=2), _randn(4097, 4096, dtype=dtype, grad=False, seed=3)
    h, y = add_rms_norm(residual, x, w, 1e-6)
    h_ref, y_ref = add_rms_norm_reference(residual, x, w, 1e-6)
    assert torch.equal(h, h_ref), "the residual sum must be bit-identical to torch's add"
    _close(y, y_ref, dtype, "add_rms_norm y")
    for got, want, name in zip(
        torch.autograd.grad((h, y), (residual, x), (dh, dy)),
        torch.autograd.grad((h_ref, y_ref), (residual, x), (dh, dy)),
        ("dres", "dx"),
        strict=True,
    ):
        _close(got, want, dtype, name)


@pytest.mark.parametrize(
    ("tokens", "hq", "hk", "head_dim", "dtype"),
    [
        (1, 32, 8, 128, torch.bfloat16),
        (4099, 32, 8, 128, torch.bfloat16),
        (333, 14, 2, 64, torch.bfloat16),
        (4099, 32, 8, 128, torch.float32),
        (333, 14, 2, 64, torch.float16),
    ],
)
def test_rope_in_place(tokens, hq, hk, head_dim, dtype):
    positions = torch.cat([torch.arange(n) for n in (tokens // 3, tokens - tokens // 3)]).cuda()[None]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    emb = torch.cat([positions[..., None] * inv_freq] * 2, dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    outs = {}
    for name, fn in (("hone", apply_rotary), ("reference", rope_reference)):
        q_flat, k_flat = (
            _randn(1, tokens, hq * head_dim, dtype=dtype),
            _randn(1, tokens, hk * head_dim, dtype=dtype, seed=1),
        )
        q = (q_flat * 1).view(1, tokens, hq, head_dim).transpose(1, 2)
        k = (k_flat * 1).view(1, tokens, hk, head_dim).transpose(1, 2)
        q_out, k_out = fn(q, k, cos, sin)
        if name == "hone":
            assert q_out is q and k_out is k, "rope must rotate in place"
        dq, dk = (
            _randn(*q_out.shape, dtype=dtype, grad=False, seed=2),
            _randn(*k_out.shape, dtype=dtype, grad=False, seed=3),
        )
        outs[name] = (
            q_out.detach().clone(),
            k_out.detach().clone(),
            *torch.autograd.grad((q_out, k_out), (q_flat, k_flat), (dq, dk)),
        )
    for got, want, name in zip(outs["hone"], outs["reference"], ("q", "k", "dq", "dk"), strict=True):
        _close(got, want, dtype, f"rope {name}")


@pytest.mark.parametrize(
    ("dtype", "activation"),
    [
        (torch.bfloat16, "silu"),
        (torch.bfloat16, "gelu_tanh"),
        (torch.bfloat16, "gelu"),
        (torch.float32, "silu"),
        (torch.float16, "gelu_tanh"),
    ],
)
def test_glu(dtype, activation):
    gate, up = _randn(4099, 12288, dtype=dtype, scale=3.0), _randn(4099, 12288, dtype=dtype, seed=1)
    dout = _randn(4099, 12288, dtype=dtype, grad=False, seed=2)
    out, ref = glu(gate, up, activation), glu_reference(gate, up, activation)
    _close(out, ref, dtype, f"{activation} out")
    for got, want, name in zip(
        torch.autograd.grad(out, (gate, up), dout),
        torch.autograd.grad(ref, (gate, up), dout),
        ("dgate", "dup"),
        strict=True,
    ):
        _close(got, want, dtype, f"{activation} {name}", scale=2.0)


def _random_nf4(out_features, in_features, nested=True, seed=0) -> NF4Weight:
    g = torch.Generator(device="cuda").manual_seed(seed)
    numel = out_features * in_features
    blocks = -(-numel // 64)
    absmax = (
        torch.randint(0, 256, (blocks,), dtype=torch.uint8, device="cuda", generator=g)
        if nested
        else torch.rand(blocks, device="cuda", generator=g) * 0.1
    )
    return NF4Weight(
        packed=torch.randint(0, 256, ((numel + 1) // 2, 1), dtype=torch.uint8, device="cuda", generator=g),
        absmax=absmax,
        code=torch.tensor(NF4_CODE, device="cuda"),
        shape=(out_features, in_features),
        dtype=torch.bfloat16,
        absmax2=torch.rand(-(-blocks // 256), device="cuda", generator=g) * 0.01 if nested else None,
        code2=torch.linspace(-1, 1, 256, device="cuda") if nested else None,
        offset=torch.tensor(0.013, device="cuda") if nested else None,
    )


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("shape", [(12288, 4096), (7, 9), (4096, 1000)])
def test_nf4_dequantize_is_bit_exact(shape, nested):
    """Bit-exact with the torch reference, which the CPU tests hold bit-exact to bitsandbytes."""
    weight = _random_nf4(*shape, nested=nested)
    absmax = nf4_absmax_reference(weight.absmax, weight.absmax2, weight.code2, weight.offset)
    for dtype in DTYPES:
        got = weight.dequantize(dtype)
        want = nf4_dequantize_reference(weight.packed, absmax, weight.code, 64, shape, dtype)
        assert torch.equal(got, want), (
            f"{shape} nested={nested} {dtype}: {(got.float() - want.float()).ne(0).sum().item()} elements differ"
        )


def test_nf4_dequantize_matches_bitsandbytes_cuda():
    bnb_functional = pytest.importorskip("bitsandbytes.functional")
    weight = 0.05 * torch.randn(4096, 1536, device="cuda")
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    ours = NF4Weight(
        packed=packed,
        absmax=state.absmax,
        code=state.code,
        shape=tuple(state.shape),
        dtype=state.dtype,
        absmax2=state.state2.absmax,
        code2=state.state2.code,
        offset=state.offset,
    )
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        state.dtype = dtype
        assert torch.equal(ours.dequantize(dtype), bnb_functional.dequantize_4bit(packed, state)), dtype


@pytest.mark.parametrize("quantized", [False, True])
def test_lora_linear(quantized):
    tokens, k, n, r = 2048, 4096, 1536, 16
    x = _randn(tokens, k, dtype=torch.bfloat16)
    a = _randn(r, k, dtype=torch.float32, scale=0.02, seed=1)
    b = _randn(n, r, dtype=torch.float32, scale=0.02, seed=2)
    dout = _randn(tokens, n, dtype=torch.bfloat16, grad=False, seed=3)
    if quantized:
        nf4 = _random_nf4(n, k)
        dense = nf4.dequantize(torch.bfloat16)
        out = lora_linear(x, a, b, 2.0, nf4=nf4)
    else:
        dense = _randn(n, k, dtype=torch.bfloat16, scale=0.02, grad=False, seed=4)
        out = lora_linear(x, a, b, 2.0, weight=dense)
    ref = lora_linear_reference(x, dense, None, a, b, 2.0)
    _close(out, ref, torch.bfloat16, "lora out")
    for got, want, name in zip(
        torch.autograd.grad(out, (x, a, b), dout),
        torch.autograd.grad(ref, (x, a, b), dout),
        ("dx", "dA", "dB"),
        strict=True,
    ):
        assert got.dtype == want.dtype, name
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


def test_benchmark_runs_and_writes_json(tmp_path):
    from hone.kernels.benchmark import main

    out = tmp_path / "bench.json"
    assert main(["--json", str(out), "--tokens", "1024", "--no-compiled-reference"]) == 0
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} >= {
        "rms_norm",
        "rope (q and k)",
        "swiglu",
        "lora_linear (fp32 adapters)",
        "nf4_dequantize",
        "qlora_linear (nf4 base)",
    }
    assert all(r["hone_ms"] > 0 and r["reference_ms"] > 0 for r in rows), rows


def test_cached_launch_matches_tritons_own_launch_and_spends_less_host_time(monkeypatch):
    """The grouped GEMM launched through CachedLaunch (as every kernel is on CUDA) gives Triton's own launch's
    result bit for bit, also on a misaligned view (another specialization); the host time per launch is printed."""
    import time

    from hone.kernels import _runtime
    from hone.kernels.moe.grouped_gemm.kernels import _grouped_gemm_kernel
    from hone.kernels.moe.grouped_gemm.launch import grouped_gemm_forward

    x = _randn(4097, 256, dtype=torch.bfloat16, grad=False)
    w = _randn(8, 256, 384, dtype=torch.bfloat16, grad=False, seed=1)
    ends = torch.tensor([0, 500, 500, 1700, 2900, 3000, 4000, 4096], dtype=torch.int32, device="cuda")

    def run(view: torch.Tensor) -> torch.Tensor:
        return grouped_gemm_forward(view, w, ends, num_rows=4096)

    monkeypatch.setattr(_runtime, "CACHED_LAUNCH", False)
    want = [run(x[:4096]), run(x[1:])]
    monkeypatch.setattr(_runtime, "CACHED_LAUNCH", True)
    got = [run(x[:4096]) for _ in range(2)] + [run(x[1:]) for _ in range(2)]
    assert _runtime._cached(_grouped_gemm_kernel)._compiled, "the direct launch path never ran"
    for i, out in enumerate(got):
        assert torch.equal(out, want[i // 2])

    seconds = {}
    for cached in (False, True):
        monkeypatch.setattr(_runtime, "CACHED_LAUNCH", cached)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            run(x[:4096])
        seconds[cached] = (time.perf_counter() - start) / 200
        torch.cuda.synchronize()
    print(
        f"\ngrouped GEMM host time per launch: Triton {seconds[False] * 1e6:.1f} us, cached "
        f"{seconds[True] * 1e6:.1f} us"
    )


@pytest.mark.parametrize(("experts", "top_k", "normalize"), [(128, 8, True), (60, 4, False), (7, 7, True)])
def test_router_top_k(experts, top_k, normalize):
    from hone.kernels.moe.router import router_top_k, router_top_k_reference

    rows = 8193
    g = torch.Generator(device="cuda").manual_seed(0)
    # distinct bf16 values per row (multiples of 1/8): no ties, which topk and the kernel may order differently
    ranks = torch.argsort(torch.rand(rows, experts, device="cuda", generator=g), dim=-1)
    logits = ((ranks - experts / 2) / 8).to(torch.bfloat16).requires_grad_(True)
    d_w = torch.randn(rows, top_k, device="cuda", generator=g).to(torch.bfloat16)
    weights, index = router_top_k(logits, top_k, normalize)
    (weights * d_w).sum().backward()
    got_grad, logits.grad = logits.grad, None
    leaf = logits.detach().float().requires_grad_(True)
    want_w, want_i = router_top_k_reference(leaf, top_k, normalize)
    (want_w * d_w.float()).sum().backward()
    assert torch.equal(index, want_i)
    _close(weights.float(), want_w.to(torch.bfloat16).float(), torch.bfloat16, "weights")
    scale = max(leaf.grad.abs().max().item(), 1.0)
    _close(got_grad.float() / scale, leaf.grad / scale, torch.bfloat16, "d logits")

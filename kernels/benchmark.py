"""GPU micro-benchmark: each Hone kernel against its torch reference, forward + backward, Qwen3-8B shapes.

    python -m hone.kernels.benchmark --json kernels.json [--tokens 16384] [--no-compiled-reference]

Times are `triton.testing.do_bench` medians in milliseconds; "compiled" is the reference under
`torch.compile` (what inductor makes of the same math), a stronger baseline than eager. Peak memory is the
extra CUDA memory one forward + backward allocates beyond its inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import triton

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

# Qwen3-8B: hidden 4096, MLP 12288, 32 query / 8 key-value heads of 128; LoRA rank 16 with fp32 adapters.
HIDDEN, INTERMEDIATE, Q_HEADS, KV_HEADS, HEAD_DIM, RANK = 4096, 12288, 32, 8, 128, 16


@dataclass
class Result:
    kernel: str
    shape: str
    pass_: str  # "fwd" or "fwd+bwd"
    reference_ms: float
    compiled_ms: float | None
    hone_ms: float
    reference_peak_mib: float
    hone_peak_mib: float

    @property
    def speedup(self) -> float:
        return self.reference_ms / self.hone_ms


def _bench(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _peak_mib(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _train_step(forward: Callable[..., object], inputs: list[torch.Tensor]) -> Callable[[], object]:
    """fwd+bwd of `forward(*inputs)` against a fixed upstream gradient, grads of the inputs that need them."""
    wrt = [t for t in inputs if t.requires_grad]
    grads = {}

    def step():
        out = forward(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        if not grads:
            grads.update({i: torch.randn_like(o) for i, o in enumerate(outs)})
        return torch.autograd.grad(outs, wrt, [grads[i] for i in range(len(outs))])

    return step


def _runner(f: Callable, inputs: list[torch.Tensor], pass_: str) -> Callable[[], object]:
    if pass_ == "fwd+bwd":
        return _train_step(f, inputs)

    def forward_only():
        with torch.no_grad():
            return f(*inputs)

    return forward_only


def _case(
    name: str, shape: str, hone: Callable, reference: Callable, inputs: list[torch.Tensor], compiled: bool
) -> list[Result]:
    reference_compiled = torch.compile(reference) if compiled else None
    results = []
    for pass_ in ("fwd", "fwd+bwd"):
        ours, theirs = _runner(hone, inputs, pass_), _runner(reference, inputs, pass_)
        compiled_ms = _bench(_runner(reference_compiled, inputs, pass_)) if reference_compiled is not None else None
        results.append(
            Result(
                kernel=name,
                shape=shape,
                pass_=pass_,
                reference_ms=_bench(theirs),
                compiled_ms=compiled_ms,
                hone_ms=_bench(ours),
                reference_peak_mib=_peak_mib(theirs),
                hone_peak_mib=_peak_mib(ours),
            )
        )
    return results


def _nf4_weight(out_features: int, in_features: int, device) -> NF4Weight:
    """A random double-quantized nf4 weight in bitsandbytes' layout (values need not come from a real model)."""
    n_blocks = out_features * in_features // 64
    g = torch.Generator(device=device).manual_seed(0)
    return NF4Weight(
        packed=torch.randint(
            0, 256, (out_features * in_features // 2, 1), dtype=torch.uint8, device=device, generator=g
        ),
        absmax=torch.randint(0, 256, (n_blocks,), dtype=torch.uint8, device=device, generator=g),
        code=torch.tensor(NF4_CODE, device=device),
        shape=(out_features, in_features),
        dtype=torch.bfloat16,
        absmax2=torch.rand(triton.cdiv(n_blocks, 256), device=device, generator=g) * 0.01,
        code2=torch.linspace(-1, 1, 256, device=device),
        offset=torch.tensor(0.02, device=device),
    )


def run_benchmarks(tokens: int = 16384, compiled_reference: bool = True, device: str = "cuda") -> list[Result]:
    """Benchmark every kernel at Qwen3-8B shapes with `tokens` tokens (one packed row), bf16 activations."""
    device, dtype = torch.device(device), torch.bfloat16

    def act(*shape, grad=True):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    results: list[Result] = []
    frozen_norm = torch.rand(HIDDEN, device=device, dtype=dtype) + 0.5
    x = act(tokens, HIDDEN)
    results += _case(
        "rms_norm",
        f"{tokens}x{HIDDEN}",
        lambda t: rms_norm(t, frozen_norm, 1e-6),
        lambda t: rms_norm_reference(t, frozen_norm, 1e-6),
        [x],
        compiled_reference,
    )
    residual = act(tokens, HIDDEN)
    results += _case(
        "add_rms_norm",
        f"{tokens}x{HIDDEN}",
        lambda r, t: add_rms_norm(r, t, frozen_norm, 1e-6),
        lambda r, t: add_rms_norm_reference(r, t, frozen_norm, 1e-6),
        [residual, x],
        compiled_reference,
    )
    head_norm = torch.rand(HEAD_DIM, device=device, dtype=dtype) + 0.5
    q_heads = act(tokens, Q_HEADS, HEAD_DIM)
    results += _case(
        "rms_norm (q heads)",
        f"{tokens}x{Q_HEADS}x{HEAD_DIM}",
        lambda t: rms_norm(t, head_norm, 1e-6),
        lambda t: rms_norm_reference(t, head_norm, 1e-6),
        [q_heads],
        compiled_reference,
    )

    positions = torch.arange(tokens, device=device) % 4096  # packed rows of 4096 tokens
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    emb = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q_flat, k_flat = act(1, tokens, Q_HEADS * HEAD_DIM), act(1, tokens, KV_HEADS * HEAD_DIM)

    def rope_with(fn):
        def run(q, k):  # as attention does: projections viewed per head; *1 gives in-place rope a fresh tensor
            q4 = (q * 1).view(1, tokens, Q_HEADS, HEAD_DIM).transpose(1, 2)
            k4 = (k * 1).view(1, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
            return fn(q4, k4, cos, sin)

        return run

    results += _case(
        "rope (q and k)",
        f"q 1x{Q_HEADS}x{tokens}x{HEAD_DIM}, k {KV_HEADS} heads",
        rope_with(apply_rotary),
        rope_with(rope_reference),
        [q_flat, k_flat],
        compiled_reference,
    )
    gate, up = act(tokens, INTERMEDIATE), act(tokens, INTERMEDIATE)
    results += _case(
        "swiglu",
        f"{tokens}x{INTERMEDIATE}",
        lambda g, u: glu(g, u, "silu"),
        lambda g, u: glu_reference(g, u, "silu"),
        [gate, up],
        compiled_reference,
    )

    weight = torch.randn(INTERMEDIATE, HIDDEN, device=device, dtype=dtype) * 0.02
    lora_a = (torch.randn(RANK, HIDDEN, device=device) * 0.01).requires_grad_()
    lora_b = (torch.randn(INTERMEDIATE, RANK, device=device) * 0.01).requires_grad_()
    results += _case(
        "lora_linear (fp32 adapters)",
        f"{tokens}x{HIDDEN} -> {INTERMEDIATE}, r={RANK}",
        lambda t, a, b: lora_linear(t, a, b, 2.0, weight=weight),
        lambda t, a, b: lora_linear_reference(t, weight, None, a, b, 2.0),
        [x, lora_a, lora_b],
        compiled_reference,
    )

    nf4 = _nf4_weight(INTERMEDIATE, HIDDEN, device)

    def nf4_reference_weight():
        absmax = nf4_absmax_reference(nf4.absmax, nf4.absmax2, nf4.code2, nf4.offset, nf4.blocksize2)
        return nf4_dequantize_reference(nf4.packed, absmax, nf4.code, nf4.blocksize, nf4.shape, dtype)

    with torch.no_grad():
        ours_ms, theirs_ms = _bench(lambda: nf4.dequantize(dtype)), _bench(nf4_reference_weight)
        compiled_ms = _bench(torch.compile(nf4_reference_weight)) if compiled_reference else None
    results.append(
        Result(
            "nf4_dequantize",
            f"{INTERMEDIATE}x{HIDDEN}",
            "fwd",
            theirs_ms,
            compiled_ms,
            ours_ms,
            _peak_mib(nf4_reference_weight),
            _peak_mib(lambda: nf4.dequantize(dtype)),
        )
    )
    results += _case(
        "qlora_linear (nf4 base)",
        f"{tokens}x{HIDDEN} -> {INTERMEDIATE}, r={RANK}",
        lambda t, a, b: lora_linear(t, a, b, 2.0, nf4=nf4),
        lambda t, a, b: lora_linear_reference(t, nf4_reference_weight(), None, a, b, 2.0),
        [x, lora_a, lora_b],
        compiled_reference,
    )
    return results


def format_table(results: list[Result]) -> str:
    header = (
        f"{'kernel':<28} {'pass':<8} {'ref ms':>8} {'compiled':>9} {'hone ms':>8} {'speedup':>8} "
        f"{'ref MiB':>9} {'hone MiB':>9}  shape"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        compiled = f"{r.compiled_ms:9.3f}" if r.compiled_ms is not None else f"{'-':>9}"
        lines.append(
            f"{r.kernel:<28} {r.pass_:<8} {r.reference_ms:8.3f} {compiled} {r.hone_ms:8.3f} "
            f"{r.speedup:7.2f}x {r.reference_peak_mib:9.1f} {r.hone_peak_mib:9.1f}  {r.shape}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where to write the results (a JSON list)")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens in the packed batch")
    parser.add_argument("--no-compiled-reference", action="store_true", help="skip the torch.compile baseline")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("hone.kernels.benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    results = run_benchmarks(args.tokens, compiled_reference=not args.no_compiled_reference)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{args.tokens} tokens, bf16"
    )
    print(format_table(results))
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(
            [dict(asdict(r), speedup=r.speedup, device=torch.cuda.get_device_name()) for r in results], f, indent=2
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

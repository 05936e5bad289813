"""Where long sequences start to pay for a dense kernel: one varlen call against a cuDNN call per sequence.

`crossover` times one attention layer's forward + backward over a packed batch of equal-length sequences, for each
length, two ways: every sequence in one `varlen_attn` call, and every sequence through cuDNN attention by spans
(`hone.core.speed.attention.long_rows`). It also times a mixed batch of 16-32K rows and the first call at a new
bucket length (cuDNN's plan build). `python -m hone.core.bench.long_rows [--json OUT]` prints the table; this is
how `long_rows.LONG_ROW_TOKENS` was chosen (docs/performance/attention.md). CUDA only.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import replace

import torch

from hone.core.bench.attention import _Layer, _timed_ms, packed_lengths
from hone.core.data.batch_lengths import register_batch
from hone.core.speed.attention import backends, probe_long_rows, probe_varlen

# Qwen3-8B's attention: 32 query heads, 8 key/value heads, head dim 128.
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def _layer_time(
    lengths: list[int],
    options: backends.VarlenOptions,
    heads: int,
    kv_heads: int,
    head_dim: int,
    device: torch.device,
    repeats: int,
    warmup: int,
) -> float:
    """Median fwd+bwd milliseconds of one attention layer over a packed batch of `lengths`."""
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32).to(device)
    register_batch(cu, lengths)
    generator = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (
        torch.randn(1, h, total, head_dim, generator=generator).to(device, torch.bfloat16).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    )
    grad_out = torch.randn(1, total, heads, head_dim, generator=generator).to(device, torch.bfloat16)
    layer = _Layer(heads, kv_heads).to(device).train()
    attend = functools.partial(backends.varlen_attention, options=options)

    def step():
        for t in (q, k, v):
            t.grad = None
        out, _ = attend(
            layer,
            q,
            k,
            v,
            None,
            scaling=head_dim**-0.5,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=max(lengths),
            max_length_k=max(lengths),
        )
        out.backward(grad_out)

    return _timed_ms(step, device, repeats, warmup)


def _first_call_ms(length: int, options: backends.VarlenOptions, heads, kv_heads, head_dim, device) -> float:
    """One call at a length no call has used yet: includes cuDNN's plan builds for its bucket."""
    return _layer_time([length], options, heads, kv_heads, head_dim, device, repeats=1, warmup=0)


def crossover(
    tokens: int = 65536,
    lengths=LENGTHS,
    *,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    repeats: int = 5,
    warmup: int = 2,
) -> dict:
    """Per length: varlen ms, cuDNN-by-spans ms and their ratio; a mixed 16-32K batch; the plan-build cost."""
    device = torch.device("cuda")
    varlen = probe_varlen(device, torch.bfloat16, heads, kv_heads, head_dim, [None])
    if isinstance(varlen, str):
        raise RuntimeError(varlen)
    long = probe_long_rows(device, torch.bfloat16, heads, kv_heads, head_dim, varlen, threshold=1)
    if isinstance(long, str):
        raise RuntimeError(long)
    by_spans = replace(varlen, long_rows=long)
    rows = []
    for length in lengths:
        batch = [length] * max(1, tokens // length)
        plain = _layer_time(batch, varlen, heads, kv_heads, head_dim, device, repeats, warmup)
        spans = _layer_time(batch, by_spans, heads, kv_heads, head_dim, device, repeats, warmup)
        rows.append(
            {
                "length": length,
                "sequences": len(batch),
                "varlen_ms": plain,
                "cudnn_ms": spans,
                "cudnn_speedup": plain / spans,
            }
        )
    mixed = packed_lengths(tokens, seed=0, low=16384, high=32768)
    mixed_plain = _layer_time(mixed, varlen, heads, kv_heads, head_dim, device, repeats, warmup)
    mixed_spans = _layer_time(mixed, by_spans, heads, kv_heads, head_dim, device, repeats, warmup)
    start = time.perf_counter()
    first = _first_call_ms(40000 + 7, by_spans, heads, kv_heads, head_dim, device)
    again = _first_call_ms(40000 + 9, by_spans, heads, kv_heads, head_dim, device)  # same bucket: no new plan
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "tokens": tokens,
        "long_rows": long.tag(),
        "rows": rows,
        "mixed": {
            "lengths": mixed,
            "varlen_ms": mixed_plain,
            "cudnn_ms": mixed_spans,
            "cudnn_speedup": mixed_plain / mixed_spans,
        },
        "new_bucket_first_call_ms": first,
        "same_bucket_next_call_ms": again,
        "seconds": time.perf_counter() - start,
    }


def format_table(result: dict) -> str:
    lines = [
        f"attention fwd+bwd, one layer, {result['heads']}/{result['kv_heads']} heads x {result['head_dim']}, "
        f"~{result['tokens']:,} tokens per batch, {result['device']}, torch {result['torch']}, cuDNN "
        f"{result['cudnn']} ({result['long_rows']})",
        f"{'sequence length':>16}{'sequences':>11}{'varlen ms':>11}{'cuDNN ms':>10}{'cuDNN speedup':>15}",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['length']:>16,}{row['sequences']:>11}{row['varlen_ms']:>11.2f}{row['cudnn_ms']:>10.2f}"
            f"{row['cudnn_speedup']:>14.2f}x"
        )
    mixed = result["mixed"]
    lines.append(
        f"{'16-32K mixed':>16}{len(mixed['lengths']):>11}{mixed['varlen_ms']:>11.2f}"
        f"{mixed['cudnn_ms']:>10.2f}{mixed['cudnn_speedup']:>14.2f}x"
    )
    lines.append(
        f"first call at a new bucket length: {result['new_bucket_first_call_ms']:.1f} ms; next length in "
        f"the same bucket: {result['same_bucket_next_call_ms']:.1f} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hone.core.bench.long_rows", description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=65536, help="tokens per batch (default 65,536)")
    parser.add_argument("--json", metavar="OUT", help="also write the numbers to OUT")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = crossover(args.tokens)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

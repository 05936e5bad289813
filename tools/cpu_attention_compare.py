"""Packed attention on the CPU, one layer's forward and backward: SDPA with one block mask over the batch against
SDPA on each packed row (`speed.attention` sdpa vs auto on a CPU), time and the bytes autograd saves for backward.

    python3 tools/cpu_attention_compare.py --tokens 2048 8192 --row 200 --heads 9 --head-dim 64
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F


def saved_mib(fn) -> float:
    """MiB of the tensors autograd keeps for backward while `fn` runs (a tensor kept twice counts twice)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total / 2**20


def block(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def rows(q, k, v, lengths):
    return torch.cat(
        [
            F.scaled_dot_product_attention(a, b, c, is_causal=True)
            for a, b, c in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2))
        ],
        2,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--row", type=int, default=200, help="tokens per packed row")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    for tokens in args.tokens:
        lengths = [args.row] * (tokens // args.row) + ([tokens % args.row] if tokens % args.row else [])
        q, k, v = (torch.randn(1, args.heads, tokens, args.head_dim, requires_grad=True) for _ in range(3))
        seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        index = torch.arange(tokens)
        mask = ((seq[:, None] == seq[None, :]) & (index[:, None] >= index[None, :]))[None, None]

        runs = (
            ("block mask", functools.partial(block, q, k, v, mask)),
            ("per row", functools.partial(rows, q, k, v, lengths)),
        )
        for name, fn in runs:
            best = float("inf")
            for _ in range(args.repeats):
                started = time.perf_counter()
                fn().sum().backward()
                best = min(best, time.perf_counter() - started)
            print(f"{tokens:6d} tokens  {name:10s}  {best * 1000:9.0f} ms  saved {saved_mib(fn):7.1f} MiB")


if __name__ == "__main__":
    main()

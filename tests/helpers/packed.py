"""Packed-row test helpers: random token rows, tiny models built once per session, the per-sequence reference loss
and gradient comparison."""

from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Row:
    input_ids: list[int]
    labels: list[int]
    source: str = "test"
    images: list = field(default_factory=list)


def random_rows(lengths, vocab=49152, seed=0, prompt=2):
    """Rows with random ids; the first `prompt` tokens carry no loss (like a user turn)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(5, vocab, (n,), generator=g).tolist()
        rows.append(Row(ids, [-100] * min(prompt, n) + ids[prompt:]))
    return rows


@functools.cache
def _built(shape: str):
    from hone.core.models.shapes import build_model

    return build_model(shape)


def model_of(shape: str):
    """A fresh copy of the tiny random-init model of this shape (built once per test session)."""
    return copy.deepcopy(_built(shape))


def per_sequence_loss(model, rows):
    """Reference: each row on its own, standard causal-LM shift, summed over trained tokens."""
    device = next(model.parameters()).device
    total = 0.0
    for row in rows:
        ids = torch.tensor([row.input_ids], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        labels = torch.tensor(row.labels[1:], device=device)
        total = total + F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    return total


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(got, want, rtol=1e-4, rel_atol=1e-4):
    """Every gradient matches; the absolute tolerance scales with that tensor's largest entry, since fp32 sums
    taken in a different order differ by a few ulps of the largest terms."""
    assert got.keys() == want.keys()
    for name in want:
        atol = rel_atol * float(want[name].abs().max()) + 1e-8
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def rows_attention(q, k, v, cu, scale=None):
    """Causal attention of each packed row alone, in varlen layout: (T, Hq, D) query, (T, Hkv, D) key / value and
    int32 offsets `cu` -> (T, Hq, Dv). A reference for the packed kernels (reads the offsets: CPU tests)."""
    import torch.nn.functional as F

    groups = q.shape[1] // k.shape[1]
    outs = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outs)


def bidirectional_varlen(
    q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), is_causal=False, **kwargs
):
    """A stand-in for torch's `varlen_attn` (CUDA only) as an image encoder calls it: attention both ways within
    each segment of (T, H, D) tensors, one SDPA call per segment; checks the call is bidirectional and that max_q is
    the longest segment."""
    assert window_size == (-1, -1) and not is_causal, "the encoder attends both ways"
    assert int((cu_q[1:] - cu_q[:-1]).max()) == max_q, "max_q is the longest segment"
    bounds = cu_q.tolist()
    outs = [
        F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1) for x in (q, k, v)), scale=scale).transpose(0, 1)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(outs)

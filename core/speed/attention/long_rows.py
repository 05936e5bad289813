"""Long sequences of a packed batch through a dense attention kernel, the short ones through one varlen call.

On Hopper, cuDNN's attention (reached through SDPA) runs a long causal sequence much faster than the
FlashAttention-2 kernel behind torch's `varlen_attn`, while for short sequences one varlen call over the whole batch
beats a call per sequence (docs/performance/attention.md). `spans` cuts a registered batch (its host-side lengths,
`hone.core.data.batch_lengths`) into runs of short sequences and single long ones, once per batch; `attention` runs
each span with its kernel and writes the pieces into one output, and in backward one gradient per input, with no
host sync. The one thing to know: a long sequence runs rounded up to a bucket length, so cuDNN builds one plan per
bucket instead of one per length; the extra rows are the tokens after it (zeros at the end of the batch), which
causal attention never lets the sequence's own queries see, and whose outputs and gradients are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hone.core.data.batch_lengths import registered

# Sequences at least this long go to the dense kernel under `speed.long_row_attention = auto`. Below it, one
# varlen call over the batch is faster than a dense call per sequence (docs/performance/attention.md).
LONG_ROW_TOKENS = 4096
# Bucket lengths: multiples of max(MIN_BUCKET, the largest power of two <= length / BUCKETS_PER_OCTAVE), so at most
# ~1/32 of a long sequence's attention is spent on rows that are dropped.
MIN_BUCKET = 256
BUCKETS_PER_OCTAVE = 32

ShortAttend = Callable[..., torch.Tensor]  # attend(q, k, v, cu_seqlens, max_len) -> (T, Hq, D), varlen layout


@dataclass(frozen=True)
class LongRows:
    """How long sequences are attended, as the probe found it works on this device.

    Attributes:
        threshold: sequences of at least this many tokens take the dense kernel.
        gqa_flag: grouped key/value heads passed as they are (`enable_gqa`); False expands them first.
        contiguous: the kernel is given contiguous (1, H, L, D) copies instead of views of the packed tensors.
        cudnn: restrict SDPA to cuDNN attention (on CUDA); False lets SDPA pick (CPU tests).
        keep: a checkpointed layer keeps its attention from the forward for its backward, while there is room
            (`speed.keep_long_row_attention`).
    """

    threshold: int
    gqa_flag: bool = True
    contiguous: bool = False
    cudnn: bool = True
    keep: bool = False

    def tag(self) -> str:
        """A short spelling for the registered attention name."""
        flags = [
            ("_repeat", not self.gqa_flag),
            ("_contiguous", self.contiguous),
            ("_any", not self.cudnn),
            ("_keep", self.keep),
        ]
        return f"long{self.threshold}" + "".join(word for word, on in flags if on)


@dataclass(frozen=True)
class Span:
    """Tokens `start:end` of a packed batch attended by one call.

    Attributes:
        long: one long sequence (dense kernel) or a run of short ones (varlen).
        cu_seqlens: a short run's offsets from 0, on the batch's device (None for a long sequence).
        max_len: the longest sequence in the span.
        padded: tokens the dense kernel runs for a long sequence (its bucket length); `end - start` otherwise.
    """

    start: int
    end: int
    long: bool
    cu_seqlens: torch.Tensor | None
    max_len: int
    padded: int


def bucket(length: int) -> int:
    """The length a long sequence runs at: rounded up to a multiple of its bucket step."""
    step = max(MIN_BUCKET, 2 ** max(0, math.floor(math.log2(max(length, 1) / BUCKETS_PER_OCTAVE))))
    return -(-length // step) * step


def build_spans(cu_seqlens: torch.Tensor, seq_lens, threshold: int) -> list[Span] | None:
    """The spans of a batch with these lengths, or None when no sequence is long (one varlen call does it all).

    The short runs' offsets are slices of the device `cu_seqlens` minus their first value: device ops, nothing read
    back."""
    if not any(n >= threshold for n in seq_lens):
        return None
    spans: list[Span] = []
    offsets = [0]
    for n in seq_lens:
        offsets.append(offsets[-1] + int(n))
    first = 0

    def flush(last: int) -> None:
        if last > first:
            local = cu_seqlens[first : last + 1] - cu_seqlens[first]
            spans.append(
                Span(
                    offsets[first],
                    offsets[last],
                    False,
                    local,
                    max(seq_lens[first:last]),
                    offsets[last] - offsets[first],
                )
            )

    for index, n in enumerate(seq_lens):
        if n >= threshold:
            flush(index)
            spans.append(Span(offsets[index], offsets[index + 1], True, None, int(n), bucket(int(n))))
            first = index + 1
    flush(len(seq_lens))
    return spans


def spans(cu_seqlens: torch.Tensor, threshold: int) -> list[Span] | None:
    """`build_spans` of a registered batch, built once per batch and threshold; None for an unregistered batch or
    one without long sequences."""
    found = registered(cu_seqlens)
    if found is None:
        return None
    seq_lens, memo = found
    key = ("long_rows", threshold)
    if key not in memo:
        memo[key] = build_spans(cu_seqlens, seq_lens, threshold)
    return memo[key]


# ---- the dense kernel --------------------------------------------------------------------------------------------


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, how: LongRows):
    """Causal attention over one sequence: (L, Hq, D) query, (L, Hkv, D) key / value -> (L, Hq, D)."""
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, L, D) views
    extra = {}
    if kh.shape[1] != qh.shape[1]:
        if how.gqa_flag:
            extra["enable_gqa"] = True
        else:
            groups = qh.shape[1] // kh.shape[1]
            kh, vh = kh.repeat_interleave(groups, dim=1), vh.repeat_interleave(groups, dim=1)
    if how.contiguous:
        qh, kh, vh = qh.contiguous(), kh.contiguous(), vh.contiguous()
    if how.cudnn and q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, **extra)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, **extra)
    return out[0].transpose(0, 1)


def _padded(t: torch.Tensor, span: Span) -> torch.Tensor:
    """A long span's tokens at its bucket length: the following tokens where the batch has them, else zeros."""
    if span.start + span.padded <= t.shape[0]:
        return t[span.start : span.start + span.padded]
    piece = t[span.start : span.end]
    return F.pad(piece, (0, 0, 0, 0, 0, span.padded - piece.shape[0]))


def _run(span: Span, q, k, v, scale, attend_short: ShortAttend, how: LongRows) -> torch.Tensor:
    if span.long:
        return dense_causal(q, k, v, scale, how)
    return attend_short(q, k, v, span.cu_seqlens, span.max_len)


def _inputs(span: Span, q, k, v) -> list[torch.Tensor]:
    if span.long:
        return [_padded(t, span) for t in (q, k, v)]
    return [t[span.start : span.end] for t in (q, k, v)]


def _whole_batch(span_list: list[Span], tokens: int) -> bool:
    return len(span_list) == 1 and span_list[0].start == 0 and span_list[0].end == tokens


def _whole(span_list: list[Span], piece: torch.Tensor, tokens: int) -> torch.Tensor | None:
    """The output itself when one span is the whole batch and its kernel's output is laid out as the batch's: no
    second copy of it beside the one the kernel keeps for backward (at 409,600 tokens of Qwen3-8B, 3.1 GiB)."""
    if not _whole_batch(span_list, tokens):
        return None
    rows = piece[:tokens]
    return rows if rows.is_contiguous() else None


def _graphs(span_list: list[Span], q, k, v, scale, attend_short: ShortAttend, how: LongRows, wanted: list[bool]):
    """Each span attended with autograd on its own detached slices: the output, and (inputs, output piece) per span
    for `_SpanAttention.backward`."""
    out = None
    graphs = []
    for span in span_list:
        inputs = [t.detach().requires_grad_(w) for t, w in zip(_inputs(span, q, k, v), wanted, strict=True)]
        with torch.enable_grad():
            piece = _run(span, *inputs, scale, attend_short, how)
        whole = _whole(span_list, piece, q.shape[0])
        if whole is not None:
            out = whole.detach()
        else:
            if out is None:
                out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
            out[span.start : span.end] = piece[: span.end - span.start].detach()
        graphs.append((inputs, piece))
    return out, graphs


class _SpanAttention(torch.autograd.Function):
    """Each span attended with autograd on its own slices; the output and input gradients assembled in place.

    Slicing the inputs under autograd would give every span a zero-filled gradient of the whole batch to add up;
    here each span's gradient is written into its rows of one tensor per input. Each span's graph (what its kernel
    saves for backward) is kept from the forward, so nothing is recomputed. `kept` is (output, graphs) a
    checkpointed layer's first forward made (see `attention`): the recompute then runs no attention at all, and the
    backward reads the graphs of the first forward, whose inputs are the same values.
    """

    @staticmethod
    def forward(ctx, q, k, v, span_list, scale, attend_short, how, kept):
        wanted = [t.requires_grad for t in (q, k, v)]
        if kept is not None:
            out, graphs = kept
        else:
            out, graphs = _graphs(span_list, q, k, v, scale, attend_short, how, wanted)
        ctx.graphs, ctx.spans, ctx.wanted = graphs, span_list, wanted
        ctx.like = [(t.shape, t.dtype, t.device) for t in (q, k, v)]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if _whole_batch(ctx.spans, ctx.like[0][0][0]):
            # One span: its kernel's gradients are the inputs' (at 409,600 tokens of Qwen3-8B a copy of them would
            # be 4.7 GiB more at the step's peak).
            inputs, piece = ctx.graphs[0]
            ctx.graphs = ctx.spans = None
            rows = grad_out.shape[0]
            grad = grad_out if piece.shape[0] == rows else F.pad(grad_out, (0, 0, 0, 0, 0, piece.shape[0] - rows))
            chosen = [t for t, w in zip(inputs, ctx.wanted, strict=True) if w]
            del inputs
            grads = iter(torch.autograd.grad(piece, chosen, grad))
            del piece, chosen
            return (*[next(grads)[:rows] if w else None for w in ctx.wanted], None, None, None, None, None)
        targets = [
            torch.empty(shape, dtype=dtype, device=device) if w else None
            for (shape, dtype, device), w in zip(ctx.like, ctx.wanted, strict=True)
        ]
        for index, span in enumerate(ctx.spans):
            inputs, piece = ctx.graphs[index]
            ctx.graphs[index] = None  # this span's saved tensors go once its gradient is written
            rows = span.end - span.start
            grad = grad_out[span.start : span.end]
            if piece.shape[0] != rows:  # the bucket's extra rows were dropped: their gradient is zero
                grad = F.pad(grad, (0, 0, 0, 0, 0, piece.shape[0] - rows))
            chosen = [t for t, w in zip(inputs, ctx.wanted, strict=True) if w]
            grads = iter(torch.autograd.grad(piece, chosen, grad))
            for target, w in zip(targets, ctx.wanted, strict=True):
                if w:
                    target[span.start : span.end] = next(grads)[:rows]
            del piece, inputs, grads
        ctx.graphs = ctx.spans = None
        return (*targets, None, None, None, None, None)


# ---- keeping attention from a checkpointed layer's forward -------------------------------------------------------

# A checkpointed layer's first forward keeps its attention graphs while the GPU's allocated memory, with them, stays
# under this share of what the process may allocate: the backward's own peak (one layer's recompute and gradients,
# the loss) needs the rest, and auto-fit and the preflight plan the step without what is kept.
KEEP_MEMORY_FRACTION = 0.5
# ...and while it leaves room for that peak, which grows with the row: a recomputed layer's backward holds about six
# times what keeping its attention does (Qwen3-8B, per token: the attention half's saved tensors, 60 KiB, flash
# attention's workspace, 44 KiB, and two hidden rows, 16 KiB, against 20 KiB kept). At 262,144 tokens that is
# 29 GiB, which half of an 80 GiB card after the weights does not hold.
BACKWARD_RESERVE_KEPT = 6


def kept_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """What keeping one layer's attention holds: q, k, v, the output and a float32 log-sum-exp per query head."""
    tokens, heads = q.shape[0], q.shape[1]
    return (q.numel() + k.numel() + v.numel() + tokens * heads * v.shape[2]) * q.element_size() + tokens * heads * 4


def room_to_keep(allocated: float, kept: float, limit: float) -> bool:
    """Whether one more layer's kept attention (`kept` bytes) fits beside `allocated` bytes in a process that may
    allocate `limit`: under KEEP_MEMORY_FRACTION of it, with the backward's reserve on top."""
    return allocated + kept * (1 + BACKWARD_RESERVE_KEPT) <= KEEP_MEMORY_FRACTION * limit


def process_memory_limit(device: torch.device) -> float:
    """What this process may allocate on `device`: the GPU's memory, or the share `set_per_process_memory_fraction`
    allows (a smaller card emulated, as `hone bench --memory-cap` does)."""
    total = torch.cuda.get_device_properties(device).total_memory
    return total * torch.cuda.get_per_process_memory_fraction(device)


def _room_to_keep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the GPU has room for one more layer's kept attention (allocator counters: no host sync)."""
    if not q.is_cuda:
        return False
    return room_to_keep(torch.cuda.memory_allocated(q.device), kept_bytes(q, k, v), process_memory_limit(q.device))


def _memo(cu_seqlens: torch.Tensor) -> dict | None:
    found = registered(cu_seqlens)
    return None if found is None else found[1]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    span_list: list[Span],
    scale: float | None,
    attend_short: ShortAttend,
    how: LongRows,
    module=None,
) -> torch.Tensor:
    """Packed causal attention by spans: (T, Hq, D) query, (T, Hkv, D) key / value in varlen layout -> (T, Hq, D).

    With `how.keep` and the attention `module` given, a checkpointed layer's first forward keeps its graphs in the
    batch's memo while there is room (`_room_to_keep`), and its recompute in backward takes them instead of
    attending again.
    """
    from hone.core.speed.checkpointing.layer_recompute import is_checkpointed_forward, is_recomputing

    key = ("kept attention", id(module))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        memo = _memo(cu_seqlens) if how.keep and module is not None and is_recomputing() else None
        kept = memo.pop(key, None) if memo is not None else None
        return _SpanAttention.apply(q, k, v, span_list, scale, attend_short, how, kept)
    if how.keep and module is not None and is_checkpointed_forward() and _room_to_keep(q, k, v):
        memo = _memo(cu_seqlens)
        if memo is not None:
            out, graphs = _graphs(span_list, q, k, v, scale, attend_short, how, [True, True, True])
            memo[key] = (out, graphs)
            return out
    out = None
    for span in span_list:
        piece = _run(span, *_inputs(span, q, k, v), scale, attend_short, how)
        whole = _whole(span_list, piece, q.shape[0])
        if whole is not None:
            return whole
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        out[span.start : span.end] = piece[: span.end - span.start]
    return out

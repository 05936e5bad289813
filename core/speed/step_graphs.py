"""A micro-batch's forward, loss and backward recorded as one CUDA graph and replayed (`speed.cuda_graphs`).

A small model's step is bound by the host launching its kernels (docs/performance/host-time.md): a graph
launches them all at once. A graph replays fixed shapes at fixed addresses, so each packed batch is padded to a
shape from a few buckets (`graph_shape`: filler rows take the padding, their targets ignored) and copied into
that shape's device tensors before replay. The first batch of a shape runs eagerly on the capture stream (lazy
initialization, autotuning), then the shape is recorded (recording computes nothing) and later batches replay it.
Past `MAX_GRAPHS` shapes, once a recording failed, and for batches with a sequence of LONG_ROW_TOKENS or more
(long-row attention splits a batch on the host by its lengths, which a replay would not do again), batches run as
they would without graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import NamedTuple

import torch

from hone.core.data.collate import IGNORE_INDEX, PackedBatch
from hone.core.speed.attention.long_rows import LONG_ROW_TOKENS
from hone.kernels.weight_casts import own_weight_casts

# Shapes recorded at most: every graph shares one memory pool, but each keeps its kernels' parameters and
# the shapes' static inputs; a run whose batches keep changing shape runs the rest eagerly.
MAX_GRAPHS = 8
# Token counts round up to 1/TOKEN_STEPS of the power of two at or below them (at most ~6 % padding).
TOKEN_STEPS = 16
# Trained positions round up to 1/TRAINED_STEPS of the padded token count: the loss's head GEMMs run on them.
TRAINED_STEPS = 8
MIN_GRANULE = 64
# The shortest "longest row" a shape gives the attention kernel (its grid is sized by it).
MIN_MAX_LENGTH = 64


class GraphShape(NamedTuple):
    """The padded sizes of a batch: tokens, sequences (real + filler), the longest sequence, trained positions."""

    tokens: int
    rows: int
    max_length: int
    trained: int


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _round_up(n: int, granule: int) -> int:
    return -(-int(n) // granule) * granule


def token_granule(tokens: int) -> int:
    """How finely token counts near `tokens` are bucketed: 1/TOKEN_STEPS of the power of two at or below."""
    return max(MIN_GRANULE, (1 << (max(int(tokens), 1).bit_length() - 1)) // TOKEN_STEPS)


def graph_shape(tokens: int, rows: int, max_length: int, trained: int) -> GraphShape:
    """The bucket a packed batch of `rows` sequences and `tokens` tokens (the longest `max_length`, `trained`
    positions with a target) is padded to. Padding tokens live in filler sequences (at least one token each);
    their number rounds the sequence count up to a power of two. A batch already on a token bucket is its own
    shape (no fillers)."""
    granule = token_granule(tokens)
    tokens_to = _round_up(tokens, granule)
    rows_to = rows
    if tokens_to > tokens:
        rows_to = _power_of_two_at_least(rows + 1)
        while tokens_to - tokens < rows_to - rows:  # each filler needs a token
            tokens_to += granule
    fillers = rows_to - rows
    filler_longest = -(-(tokens_to - tokens) // fillers) if fillers else 0
    longest = min(_power_of_two_at_least(max(max_length, filler_longest, MIN_MAX_LENGTH)), tokens_to)
    trained_to = min(_round_up(max(trained, 1), max(MIN_GRANULE, tokens_to // TRAINED_STEPS)), tokens_to)
    return GraphShape(tokens_to, rows_to, longest, trained_to)


def shape_of(batch: PackedBatch) -> GraphShape:
    return graph_shape(batch.num_tokens, len(batch.seq_lens), batch.max_seqlen, batch.num_trained)


def _filler_lengths(padding: int, fillers: int) -> list[int]:
    """`padding` tokens over `fillers` sequences, as even as can be (each at least one token)."""
    if fillers == 0:
        return []
    base, extra = divmod(padding, fillers)
    return [base + 1 if i < extra else base for i in range(fillers)]


def pad_packed(batch: PackedBatch, shape: GraphShape) -> PackedBatch:
    """`batch` (on the CPU) padded to `shape`: filler sequences of token 0 after the real ones, their targets
    ignored; the trained positions padded with the batch's last real token, whose target is always ignored (a
    sequence's last token predicts nothing), so the loss and every gradient are the batch's own. The counts
    (`num_tokens`, `num_trained`) stay the real ones."""
    total, padding = batch.num_tokens, shape.tokens - batch.num_tokens
    fillers = shape.rows - len(batch.seq_lens)
    if padding < fillers or (padding > 0) != (fillers > 0) or batch.num_trained > shape.trained:
        raise ValueError(f"a batch of {total} tokens in {len(batch.seq_lens)} sequences does not fit {shape}")
    lengths = _filler_lengths(padding, fillers)
    if max(lengths, default=0) > shape.max_length or batch.max_seqlen > shape.max_length:
        raise ValueError(f"a sequence of the padded batch is longer than {shape.max_length} tokens")
    pin = batch.input_ids.is_pinned()
    trained = batch.trained_positions
    if trained is None:
        trained = torch.nonzero(batch.targets.reshape(-1) != IGNORE_INDEX).flatten()

    def padded(tensor: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
        out = torch.cat([tensor.reshape(-1), tail.to(tensor.dtype)])
        return out.pin_memory() if pin else out

    positions = [torch.arange(n, dtype=torch.int64) for n in lengths]
    ends = torch.tensor(lengths, dtype=torch.int64).cumsum(0) + total
    return dataclasses.replace(
        batch,
        input_ids=padded(batch.input_ids, torch.zeros(padding, dtype=torch.int64))[None],
        position_ids=padded(batch.position_ids, torch.cat([torch.zeros(0, dtype=torch.int64), *positions]))[None],
        targets=padded(batch.targets, torch.full((padding,), IGNORE_INDEX, dtype=torch.int64))[None],
        seq_lens=[*batch.seq_lens, *lengths],
        cu_seqlens=padded(batch.cu_seqlens, ends),
        max_seqlen=shape.max_length,
        trained_positions=padded(trained, torch.full((shape.trained - batch.num_trained,), total - 1)),
    )


class _Slot:
    """One shape: its static device batch, the divisor's tensor, and its graph once recorded."""

    def __init__(self, shape: GraphShape, example: PackedBatch, device: torch.device):
        self.shape = shape
        self.batch = example.to(device)  # fresh device tensors: the addresses every replay reads
        for name in ("input_ids", "position_ids", "targets", "cu_seqlens", "trained_positions"):
            setattr(self.batch, name, getattr(self.batch, name).clone())
        self.divisor = torch.ones((), dtype=torch.float32, device=device)
        self.peak_bytes = 0  # the allocator's peak when this shape's eager pass ended: what a replay holds too
        self.graph: torch.cuda.CUDAGraph | None = None
        self.summed: torch.Tensor | None = None  # the recorded loss sum, rewritten by every replay
        self.runs = 0

    def load(self, padded: PackedBatch, units: int) -> None:
        """Copy a padded host batch into the static tensors (asynchronous from pinned memory)."""
        for name in ("input_ids", "position_ids", "targets", "cu_seqlens", "trained_positions"):
            getattr(self.batch, name).copy_(getattr(padded, name), non_blocking=True)
        self.batch.seq_lens = padded.seq_lens
        self.divisor.fill_(1.0 / max(units, 1))


@dataclasses.dataclass
class GraphStats:
    """What the graphs did, for the run's notices and the benchmark."""

    recorded: int = 0
    replays: int = 0
    eager: int = 0  # micro-batches that ran without a graph (first of a shape, past the limit, after a failure)
    dropped: int = 0  # times the recordings were dropped because the gradients were replaced


class StepGraphs:
    """Runs a micro-batch's forward and backward through CUDA graphs, one per padded shape.

    Args:
        pass_: `pass_(batch, divisor)` runs forward, loss and backward of a device batch, back-propagating the
            loss sum times `divisor` (a 0-d tensor), and returns the loss sum (fp32 0-d tensor).
        params: the trainable parameters. Their gradients must be allocated (zeros) before a recording and never
            replaced or set to None while graphs live: the recorded backward adds into them where they are.
        device: the CUDA device.
        note: `note(message, level)` for what the run should say once (a recording that failed, and why).
        settle: called before a recording, to let the process's other threads finish what they do with CUDA
            (the next step's collation pins host memory).
    """

    def __init__(self, pass_, params, device, note=None, settle=None):
        self.pass_, self.params, self.device = pass_, list(params), torch.device(device)
        self.settle = settle or (lambda: None)
        self.note = note or (lambda message, level="info": None)
        self.stats = GraphStats()
        self.failed: str | None = None
        self._slots: dict[GraphShape, _Slot] = {}
        self._addresses: list[int] | None = None  # the gradients' addresses the recorded graphs add into
        # the largest eager-pass peak among the shapes replayed since `take_replayed_peak`: a replay allocates
        # nothing, so the allocator's peak misses the memory its recording's pool holds for it
        self.replayed_peak = 0
        self._stream = torch.cuda.Stream(device=self.device)
        self._pool = torch.cuda.graph_pool_handle()

    def ensure_gradients(self) -> None:
        """Zero gradients where there are none: a recorded backward adds into existing ones in place."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)

    def run(self, batch: PackedBatch, units: int) -> torch.Tensor | None:
        """The loss sum of `batch` (a host batch) after its backward, or None when this batch should run the
        ordinary way (graphs failed earlier, or this shape is one too many)."""
        if self.failed is not None:
            return None
        shape = shape_of(batch)
        slot = self._slots.get(shape)
        if slot is None and len(self._slots) >= MAX_GRAPHS:
            self.stats.eager += 1
            return None
        padded = pad_packed(batch, shape)
        if max(padded.seq_lens) >= LONG_ROW_TOKENS:  # long rows are split on the host by their lengths
            self.stats.eager += 1
            return None
        if slot is None:
            slot = self._slots[shape] = _Slot(shape, padded, self.device)
        self.ensure_gradients()
        if self._addresses is not None and self._addresses != self._gradient_addresses():
            self._forget_recordings()  # something outside replaced the gradients the graphs add into
        slot.load(padded, units)
        slot.runs += 1
        if slot.runs == 1:  # eagerly first (lazy initialization, autotuning), then recorded for the next time
            summed = self._eager(slot)
            slot.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self._record(slot)
            return summed
        if slot.graph is None and not self._record(slot):
            return self._eager(slot)
        slot.graph.replay()
        self.stats.replays += 1
        self.replayed_peak = max(self.replayed_peak, slot.peak_bytes)
        return slot.summed.clone()

    def take_replayed_peak(self) -> int:
        """The peak allocated bytes the replays since the last call stand for (0: none), and start again."""
        peak, self.replayed_peak = self.replayed_peak, 0
        return peak

    def _gradient_addresses(self) -> list[int]:
        return [p.grad.data_ptr() for p in self.params]

    def _forget_recordings(self) -> None:
        """Drop every recorded graph (their shapes are recorded again when they next come)."""
        for slot in self._slots.values():
            slot.graph = slot.summed = None
        self._addresses = None
        self.stats.dropped += 1

    def _on_stream(self):
        """Run on the capture stream, ordered after the work already queued on the current one."""
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._stream)

    def _eager(self, slot: _Slot) -> torch.Tensor:
        self.stats.eager += 1
        with self._on_stream(), own_weight_casts():  # casts made and freed on this stream
            summed = self.pass_(slot.batch, slot.divisor).detach()
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self._stream)
        if summed.is_cuda:  # made on this stream, read and freed on the current one
            summed.record_stream(current)
        return summed

    def _record(self, slot: _Slot) -> bool:
        """Record `slot`'s pass; False (and graphs off for the rest of the run) when it cannot be recorded or
        the recorded backward would not add into the gradients that are there now."""
        grads = [p.grad for p in self.params]
        addresses = [g.data_ptr() for g in grads]
        graph = torch.cuda.CUDAGraph()
        self.settle()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        # thread_local: the collation thread may pin memory meanwhile; autograd's thread launches onto the
        # recorded stream either way
        recording = torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local")
        try:
            with own_weight_casts(), recording:
                summed = self.pass_(slot.batch, slot.divisor).detach()
        except Exception as error:  # any failure to record means: run without graphs
            self._give_up(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", grads)
            return False
        moved = [p for p, a in zip(self.params, addresses, strict=True) if p.grad is None or p.grad.data_ptr() != a]
        if moved:
            self._give_up(f"the recorded backward replaced {len(moved)} gradients instead of adding into them", grads)
            return False
        slot.graph, slot.summed = graph, summed
        self._addresses = addresses
        self.stats.recorded += 1
        return True

    def _give_up(self, why: str, grads: list[torch.Tensor]) -> None:
        """Graphs off for the rest of the run: the gradients put back as they were before the attempt (a
        recording computes nothing), and the recorded graphs dropped."""
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g
        self.failed = why
        self._slots.clear()
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(self.device)
        self.note(f"CUDA graphs off for the rest of this run: recording a step failed ({why})", "warning")

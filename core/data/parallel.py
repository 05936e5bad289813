"""Encode row batches in worker processes when the data is large enough for that to pay off.

The main process reads, normalizes and checks rows (cheap, and it must count every row in order); workers render
the chat template and tokenize (the expensive part). Batches come back in submission order, with at most two per
worker in flight, so memory stays flat.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from hone.core.data.labels import RowEncoder
from hone.core.data.loaders import Source
from hone.core.data.rows import Row

# Below this many bytes of input a split is encoded in-process: starting workers (each imports transformers and
# loads the tokenizer) costs a few seconds, which small datasets finish in anyway.
PARALLEL_MIN_BYTES = 16 << 20
# Most workers started; past this the single reading process is the bottleneck.
MAX_WORKERS = 8
# Batches in flight per worker: one being encoded, one waiting, so no worker idles between batches.
_IN_FLIGHT_PER_WORKER = 2

_worker_encoder: RowEncoder | None = None


def default_workers(sources: list[Source]) -> int:
    """Worker processes for a split: $HONE_DATA_WORKERS if set, else 0 (in-process) for small inputs or machines
    with fewer than 4 cores, else one per core but one, up to MAX_WORKERS."""
    forced = os.environ.get("HONE_DATA_WORKERS")
    if forced is not None and forced.strip():
        return max(0, int(forced))
    cores = os.cpu_count() or 1
    size = 0
    for source in sources:
        if source.path is not None and source.path.is_file():
            size += source.path.stat().st_size
    if cores < 4 or size < PARALLEL_MIN_BYTES:
        return 0
    return min(MAX_WORKERS, cores - 1)


def encode_stream(encoder: RowEncoder, batches: Iterable[list[Row]], workers: int) -> Iterator[tuple[list, list]]:
    """Yield (batch, encoder.encode(batch)) for every batch, in order; in `workers` processes when > 0.

    Workers are forked where the platform can (Linux), like PyTorch's DataLoader: the encoder is inherited, not
    pickled, and the main script is not imported again (with "spawn", a script without an `if __name__ ==
    "__main__":` guard re-runs in each worker, and the pool hangs). Workers never touch CUDA or Qt, so forking a
    process that has them is safe. Elsewhere (Windows, macOS) they are spawned.
    """
    if workers <= 0:
        for batch in batches:
            yield batch, encoder.encode(batch)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    # Each worker is one process per core already; tokenizers' own thread pool would only oversubscribe (and
    # after a fork it warns and switches itself off).
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context(method),
            initializer=_start_worker,
            initargs=(encoder,),
        ) as pool:
            pending: deque = deque()
            for batch in batches:
                pending.append((batch, pool.submit(_encode, batch)))
                if len(pending) >= workers * _IN_FLIGHT_PER_WORKER:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _start_worker(encoder: RowEncoder) -> None:
    global _worker_encoder
    _worker_encoder = encoder


def _encode(batch: list[Row]) -> list:
    assert _worker_encoder is not None
    return _worker_encoder.encode(batch)

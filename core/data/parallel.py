"""Encode row batches in worker processes that the main process watches, one row at a time.

The main process reads, normalizes and checks rows (cheap, and it must count every row in order); workers render
the chat template and tokenize (the expensive part). Batches come back in submission order, with at most two per
worker waiting, so memory stays flat.

A tokenizer call cannot be interrupted (it is Rust code holding the thread), and a tokenizer.json from the Hub can
hold a regex that backtracks for minutes on one row. So each worker reports the row it is on, and a row that takes
longer than `row_time_limit` is skipped with the reason: its worker is killed and a new one continues with the
rest. Small inputs get one watched worker where processes fork (Linux: a few ms); HONE_DATA_WORKERS=0 encodes in
this process, unwatched, as does a small input where processes cannot fork (Windows, macOS).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from hone.core.control import env_int
from hone.core.data.labels import RowEncoder
from hone.core.data.loaders import Source
from hone.core.data.rows import TOO_SLOW, Row, RowProblem
from hone.core.errors import DataError, HoneError

# Below this many bytes of input a split is encoded in-process: starting workers (each imports transformers and
# loads the tokenizer) costs a few seconds, which small datasets finish in anyway.
PARALLEL_MIN_BYTES = 16 << 20
# Most workers started; past this the single reading process is the bottleneck.
MAX_WORKERS = 8
# HONE_DATA_WORKERS: worker processes for encoding, 0 = in this process; more than this is a typo, not a machine.
WORKERS_ENV = "HONE_DATA_WORKERS"
MAX_FORCED_WORKERS = 256
# Batches encoded or waiting per worker, so no worker idles between batches and memory stays flat.
_IN_FLIGHT_PER_WORKER = 2
# A row may take ROW_TIME_BASE_S to render and tokenize, plus ROW_TIME_PER_CHAR_S per character: tokenizers
# manage 1-5 MB/s on one core and a row takes milliseconds, so this is 10-50x what any sound tokenizer needs even
# on a busy machine, while a backtracking regex (34 s for a 7 KB row) is stopped in seconds.
ROW_TIME_BASE_S = 3.0
ROW_TIME_PER_CHAR_S = 1e-5
# How often the main process looks at its workers while it waits for a batch.
_POLL_S = 0.05
_CAN_FORK = "fork" in multiprocessing.get_all_start_methods()


def default_workers(sources: list[Source]) -> int:
    """Worker processes for a split: $HONE_DATA_WORKERS if set, else 0 (in-process) for small inputs or machines
    with fewer than 4 cores, else one per core but one, up to MAX_WORKERS."""
    forced = env_int(WORKERS_ENV, minimum=0, maximum=MAX_FORCED_WORKERS)
    if forced is not None:
        return forced
    cores = os.cpu_count() or 1
    size = 0
    for source in sources:
        if source.path is not None and source.path.is_file():
            size += source.path.stat().st_size
    if cores < 4 or size < PARALLEL_MIN_BYTES:
        return 1 if _CAN_FORK else 0  # one watched worker costs a fork; a spawned one would cost seconds
    return min(MAX_WORKERS, cores - 1)


def encode_stream(encoder: RowEncoder, batches: Iterable[list[Row]], workers: int) -> Iterator[tuple[list, list]]:
    """Yield (batch, encoder.encode(batch)) for every batch, in order; in `workers` watched processes when > 0, a
    row past its time limit (`row_time_limit`) coming back as a RowProblem.

    Workers are forked where the platform can (Linux), like PyTorch's DataLoader: the encoder is inherited, not
    pickled, and the main script is not imported again (with "spawn", a script without an `if __name__ ==
    "__main__":` guard re-runs in each worker, and the pool hangs). Workers never touch CUDA or Qt, so forking a
    process that has them is safe. Elsewhere (Windows, macOS) they are spawned.

    Raises:
        DataError: the chat template went past its limits, or a worker failed in a way that is not one row's.
    """
    if workers <= 0:
        for batch in batches:
            yield batch, encoder.encode(batch)
        return
    context = multiprocessing.get_context("fork" if _CAN_FORK else "spawn")
    # Each worker is one process per core already; tokenizers' own thread pool would only oversubscribe (and
    # after a fork it warns and switches itself off).
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    pool: list[_Worker] = []
    try:
        pool = [_Worker(context, encoder) for _ in range(workers)]
        yield from _run(pool, iter(batches), context, encoder)
    finally:
        for worker in pool:
            worker.stop()
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def row_time_limit(row: Row) -> float:
    """Seconds a row may take to render and tokenize: ROW_TIME_BASE_S plus ROW_TIME_PER_CHAR_S per character."""
    messages = row.messages or []
    chars = len(row.text) if row.text is not None else sum(len(str(m.get("content", ""))) for m in messages)
    return ROW_TIME_BASE_S + ROW_TIME_PER_CHAR_S * chars


@dataclass
class _Job:
    """One batch: `results` fills in as workers finish; `todo` holds the positions still to encode."""

    number: int
    batch: list[Row]
    results: list = field(default_factory=list)
    todo: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.results = [None] * len(self.batch)
        self.todo = list(range(len(self.batch)))


class _Worker:
    """One encoding process, its pipe and its progress: (job number, step) in shared memory, where step k < n is
    "rendering row k" and n + k "tokenizing row k" of the n rows sent."""

    def __init__(self, context, encoder: RowEncoder):
        self.progress = context.RawArray("q", 2)
        parent, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, encoder, self.progress), daemon=True)
        self.process.start()
        child.close()
        self.conn = parent
        self.job: _Job | None = None
        self.sent: list[int] = []
        self.mark: tuple[int, int] = (-1, -1)
        self.since = 0.0

    def give(self, job: _Job) -> None:
        self.job, self.sent = job, list(job.todo)
        self.conn.send((job.number, [job.batch[p] for p in self.sent]))
        self.mark, self.since = (-1, -1), time.monotonic()

    def current(self, now: float) -> tuple[int, bool, float]:
        """(position in the job's batch of the row being worked on, whether it is tokenizing, seconds on it)."""
        assert self.job is not None
        mark = (int(self.progress[0]), int(self.progress[1]))
        if mark != self.mark:
            self.mark, self.since = mark, now
        step = mark[1] if mark[0] == self.job.number else 0  # not started yet: the first row is next
        n = len(self.sent)
        return self.sent[min(step % n, n - 1)], step >= n, now - self.since

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


def _run(pool: list[_Worker], batches: Iterator[list[Row]], context, encoder: RowEncoder) -> Iterator[tuple]:
    """Hand batches to the workers, watch them, and yield the finished ones in order."""
    order: deque[_Job] = deque()  # every job not yet yielded, in order
    waiting: deque[_Job] = deque()  # jobs to (re)send: those of a killed worker go first
    number, exhausted = 0, False
    while True:
        for worker in pool:
            if worker.job is not None:
                continue
            if waiting:
                worker.give(waiting.popleft())
            elif not exhausted and len(order) < len(pool) * _IN_FLIGHT_PER_WORKER:
                batch = next(batches, None)
                if batch is None:
                    exhausted = True
                    continue
                number += 1
                order.append(_Job(number, batch))
                worker.give(order[-1])
        while order and not order[0].todo:  # a job has rows to do until its results are all in
            job = order.popleft()
            yield job.batch, job.results
        if exhausted and not order:
            return
        busy = [w for w in pool if w.job is not None]
        ready = wait([w.conn for w in busy], timeout=_POLL_S) if busy else []
        now = time.monotonic()
        for k, worker in enumerate(pool):
            if worker.job is None:
                continue
            requeue = _receive(worker) if worker.conn in ready else _watch(worker, now)
            if requeue is not None:
                worker.stop()
                pool[k] = _Worker(context, encoder)
                if requeue.todo:
                    waiting.appendleft(requeue)


def _receive(worker: _Worker) -> _Job | None:
    """Take a worker's finished batch; returns the job to send again when the worker died on a row."""
    job = worker.job
    assert job is not None
    try:
        kind, payload = worker.conn.recv()
    except (EOFError, OSError):
        worker.process.join(timeout=1)
        position, tokenizing, _ = worker.current(time.monotonic())
        why = (
            f"the process {'tokenizing' if tokenizing else 'rendering'} it ended (exit code {worker.process.exitcode})"
        )
        return _skip(job, position, why)
    if kind == "error":
        raise payload
    for position, result in zip(worker.sent, payload, strict=True):
        job.results[position] = result
    job.todo = []
    worker.job = None
    return None


def _watch(worker: _Worker, now: float) -> _Job | None:
    """The job to send again (without its slow row) when the worker's row is past its limit, else None."""
    job = worker.job
    assert job is not None
    position, tokenizing, seconds = worker.current(now)
    limit = row_time_limit(job.batch[position])
    if seconds <= limit:
        return None
    if not tokenizing:  # every row goes through the same template: this one is the template's fault
        raise DataError(
            f"the chat template took over {limit:.1f} s to render {job.batch[position].source}; a template this slow "
            "is stopped rather than run on every row",
            "the template is at fault, not the row: set data.chat_template to a template file you trust, or chatml",
        )
    return _skip(job, position, f"took over {limit:.1f} s to tokenize (the tokenizer's rules are too slow on its text)")


def _skip(job: _Job, position: int, why: str) -> _Job:
    """Mark the row at `position` skipped; the job goes back with its other unfinished rows."""
    row = job.batch[position]
    job.results[position] = RowProblem(row.source, TOO_SLOW, "", f"{why}; it was skipped: shorten or remove it")
    job.todo = [p for p in job.todo if p != position]
    return job


def _serve(conn, encoder: RowEncoder, progress) -> None:
    """A worker: encode each batch received, saying which row it is on, until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle; it stops the workers
    while True:
        try:
            number, rows = conn.recv()
        except (EOFError, OSError):
            return
        progress[1] = 0
        progress[0] = number

        def step(k: int) -> None:
            progress[1] = k

        try:
            reply: tuple = ("ok", encoder.encode(rows, progress=step))
        except HoneError as e:
            reply = ("error", type(e)(e.message, e.advice))
        except Exception as e:  # sent back whole when it pickles, as the main process would have raised it
            reply = ("error", e)
        try:
            conn.send(reply)
        except Exception as e:
            conn.send(("error", DataError(f"encoding rows failed: {type(e).__name__}: {e}", "")))

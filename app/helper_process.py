"""The Studio's helper process: heavy one-off jobs (exports, reading a model, memory plans) run in a child process,
so that their imports (torch, transformers) and their Python work never hold the window's interpreter lock. The
window stays responsive on a laptop's few cores; the child runs at a lower priority and is started on first use.

`in_helper(fn)` gives a callable for `Task` (hone.app.workers): `Task(in_helper(run_export), run_dir, …)`. The
task's thread blocks on the child's answer; progress reports come back through a queue, all before the result.
`fn` and its arguments and result must pickle (module-level functions, dataclasses). A child that dies (killed,
out of memory) fails the job with that reason and is replaced on the next one; a child that used the GPU is
retired after its job, so it never holds GPU memory that a training run needs.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hone.app.task_errors import RemoteTaskError, TaskError, describe_exception

CHILD_NICENESS = 10  # below the window, so that the window's thread gets a core first
END = "__end__"  # the last progress message of a job: everything it reported has arrived
END_WAIT_S = 5.0

_progress: Any = None  # the child's end of the progress queue (set by _child_setup)


def _child_setup(progress: Any) -> None:
    """Runs first in the helper process: lower priority, leave a core to the window, ignore the terminal's Ctrl-C
    (the window decides when the helper ends)."""
    global _progress
    _progress = progress
    if hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(CHILD_NICENESS)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) - 1)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_job(job: int, fn: Callable[..., Any], args: tuple, kwargs: dict, wants_progress: bool):
    """In the child: (ok, value or TaskError, used the GPU). Progress goes to the queue, tagged with the job."""
    if wants_progress:
        kwargs = dict(kwargs, progress=lambda *values: _progress.put((job, values[0] if len(values) == 1 else values)))
    try:
        outcome = (True, fn(*args, **kwargs))
    except Exception as e:
        outcome = (False, describe_exception(e))
    finally:
        _progress.put((job, END))
    torch = sys.modules.get("torch")
    used_gpu = bool(torch is not None and torch.cuda.is_initialized())
    return (*outcome, used_gpu)


def _accepts_progress(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "progress" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class HelperProcess:
    """One child process that runs jobs one after another (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._queue: Any = None
        self._listeners: dict[int, tuple[Callable[[Any], None] | None, threading.Event]] = {}
        self._jobs = itertools.count(1)
        self._environment: dict[str, str] = {}

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is not None and dict(os.environ) != self._environment:
            self._retire_locked()  # a child sees the environment it was started with (Hub settings, the cache)
        if self._pool is None:
            self._environment = dict(os.environ)
            context = multiprocessing.get_context("spawn")  # fork would copy the window's threads and Qt state
            self._queue = context.Queue()
            self._pool = ProcessPoolExecutor(1, context, initializer=_child_setup, initargs=(self._queue,))
            threading.Thread(target=self._relay, args=(self._queue,), name="helper-progress", daemon=True).start()
        return self._pool

    def _relay(self, source: Any) -> None:
        """Hand each progress report to its job's listener, in order; ends when the queue is closed."""
        while True:
            try:
                job, value = source.get()
            except (EOFError, OSError, ValueError, TypeError):
                return
            if job is None:
                source.close()
                return
            with self._lock:
                listener = self._listeners.get(job)
            if listener is None:
                continue
            report, ended = listener
            if value == END:
                ended.set()
            elif report is not None:
                report(value)

    def call(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, progress=None) -> Any:
        """fn(*args, **kwargs) in the child, blocking the calling (worker) thread until it ends; its exception is
        raised here as a RemoteTaskError holding the child's description of it."""
        ended = threading.Event()
        with self._lock:
            pool = self._start()
            job = next(self._jobs)
            self._listeners[job] = (progress, ended)
            try:
                future = pool.submit(_run_job, job, fn, args, dict(kwargs or {}), _accepts_progress(fn))
            except (BrokenProcessPool, RuntimeError) as e:
                self._listeners.pop(job, None)
                self._retire_locked()
                raise RemoteTaskError(_died(str(e))) from None
        try:
            ok, value, used_gpu = future.result()
        except BrokenProcessPool:
            with self._lock:
                self._listeners.pop(job, None)
                self._retire_locked()
            raise RemoteTaskError(_died("")) from None
        except Exception as e:  # what could not be pickled on its way there or back
            with self._lock:
                self._listeners.pop(job, None)
            raise RemoteTaskError(describe_exception(e)) from None
        ended.wait(END_WAIT_S)  # the job's last reports land before its result does
        with self._lock:
            self._listeners.pop(job, None)
        if used_gpu:
            with self._lock:
                self._retire_locked()
        if not ok:
            raise RemoteTaskError(value)
        return value

    def _retire_locked(self) -> None:
        """End the current child once its queued jobs are done; the next job starts a fresh one."""
        pool, source = self._pool, self._queue
        self._pool = self._queue = None
        if pool is not None:
            threading.Thread(target=_wind_down, args=(pool, source), name="helper-retire", daemon=True).start()

    def end_jobs(self) -> None:
        """The window is closing: a job still running there (an export) is ended now, by ending the child; nothing
        is waited for. An idle child is left to end with the Studio's process."""
        with self._lock:
            if not self._listeners:
                return
            pool, source = self._pool, self._queue
            self._pool = self._queue = None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            if process.is_alive():
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        _close(source)

    def is_started(self) -> bool:
        return self._pool is not None


def _wind_down(pool: ProcessPoolExecutor, source: Any) -> None:
    pool.shutdown(wait=True)
    _close(source)


def _close(source: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        source.put((None, None))  # ends the relay thread, which closes the queue


def _died(detail: str) -> TaskError:
    return TaskError(
        "the Studio's helper process ended before the job finished (it was killed, or ran out of memory)",
        "try again; if it happens each time, close other programs to free memory",
        detail,
    )


HELPER = HelperProcess()


def in_helper(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, run in the helper process when called: for `Task(in_helper(fn), *args, on_progress=…)`."""

    def call(*args: Any, progress: Callable[[Any], None] | None = None, **kwargs: Any) -> Any:
        return HELPER.call(fn, args, kwargs, progress)

    call.__name__ = getattr(fn, "__name__", "job")
    call.__doc__ = fn.__doc__
    return call

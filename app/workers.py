"""Work off the GUI thread: one-off tasks (inspect a model, validate data, export), the training run, and the
telemetry poller. Each is a QObject worker moved to its own QThread; results come back as queued signals, so
the GUI thread only ever receives plain Python objects (events, reports), never tensors.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from PySide6.QtCore import QCoreApplication, QEventLoop, QMetaObject, QObject, Qt, QThread, QTimer, Signal, Slot

from hone.app.task_errors import OOM_ADVICE, TaskError, advice_for, describe_exception  # noqa: F401  (re-exported)
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.events import Event, RunFailed, RunFinished

# ---------------------------------------------------------------------------------------------------------------
# One-off tasks


class _TaskWorker(QObject):
    result = Signal(object)
    failed = Signal(object)
    progress = Signal(object)
    done = Signal()

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict):
        super().__init__()
        self._fn, self._args, self._kwargs = fn, args, kwargs

    @Slot()
    def run(self) -> None:
        try:
            kwargs = dict(self._kwargs)
            if _accepts(self._fn, "progress"):
                kwargs["progress"] = self._report
            self.result.emit(self._fn(*self._args, **kwargs))
        except Exception as e:
            self.failed.emit(describe_exception(e))
        finally:
            self.done.emit()

    def _report(self, *values: Any) -> None:
        self.progress.emit(values[0] if len(values) == 1 else values)


class Task(QObject):
    """Runs `fn(*args, **kwargs)` on its own thread; callbacks run on the GUI thread.

    If `fn` takes a `progress` keyword, it gets a callable that forwards whatever it is given to `on_progress`.
    """

    finished = Signal()
    _running: ClassVar[set[Task]] = set()  # keeps tasks (and their threads) alive until they end

    def __init__(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_result: Callable[[Any], None] | None = None,
        on_error: Callable[[TaskError], None] | None = None,
        on_progress: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        self._on_result, self._on_error, self._on_progress = on_result, on_error, on_progress
        self.error: TaskError | None = None
        self.value: Any = None
        self._thread = QThread()
        self._thread.setObjectName(f"task:{getattr(fn, '__name__', 'task')}")
        self._worker = _TaskWorker(fn, args, kwargs)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.result.connect(self._got_result)
        self._worker.failed.connect(self._got_error)
        self._worker.progress.connect(self._got_progress)
        self._worker.done.connect(self._thread.quit)
        self._thread.finished.connect(self._ended)
        Task._running.add(self)
        self._thread.start()

    @classmethod
    def running(cls) -> list[Task]:
        return list(cls._running)

    def is_running(self) -> bool:
        return self in Task._running

    def wait(self, ms: int = 30_000) -> bool:
        """Block until the thread ends (for shutdown); queued callbacks still need the event loop to run."""
        return self._thread.wait(ms)

    @Slot(object)
    def _got_result(self, value: Any) -> None:
        self.value = value
        if self._on_result:
            self._on_result(value)

    @Slot(object)
    def _got_error(self, error: TaskError) -> None:
        self.error = error
        if self._on_error:
            self._on_error(error)

    @Slot(object)
    def _got_progress(self, value: Any) -> None:
        if self._on_progress:
            self._on_progress(value)

    @Slot()
    def _ended(self) -> None:
        Task._running.discard(self)
        self.finished.emit()


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------------------------------------------------------
# The training run

TrainerFactory = Callable[[RunConfig, RunControl, "Path | None"], Iterable[Event]]


def core_trainer(
    config: RunConfig, control: RunControl, resume: Path | None = None, data_changed: str = "refuse"
) -> Iterable[Event]:
    """Events of a core Trainer run, continuing the run in `resume` when given, on training data that changed since
    its checkpoint as `data_changed` says (torch is imported here, on the worker thread, when a run starts)."""
    import torch

    from hone.core.api import Trainer

    if not torch.cuda.is_available():
        # A CPU run would otherwise take every core for its matmuls and starve the window's thread; leave it one.
        torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))

    if resume is None:
        return _then_scored(Trainer(config, control))
    return _then_scored(Trainer(config, control, resume_dir=resume, data_changed=data_changed))


def _then_scored(trainer) -> Iterable[Event]:
    """The run's events; then, for train.eval_checkpoints, its checkpoints scored as `hone train` scores them (the
    same model, scores.json), said in a Notice after the run's end."""
    from hone.core.events import Notice

    last = None
    for last in trainer.run():
        yield last
    if not (isinstance(last, RunFinished) and not last.stopped and trainer.config.train.eval_checkpoints):
        return
    from hone.core.api import DEFAULT_METRIC, score_trained_checkpoints
    from hone.core.errors import HoneError

    try:
        table = score_trained_checkpoints(trainer)
    except HoneError as e:
        yield Notice("scores", f"the checkpoints were not scored: {e.message}; {e.advice}", level="warning")
        return
    best = table.best(DEFAULT_METRIC)
    said = f"; the best by held-out loss is step {best.checkpoint}" if best is not None else ""
    yield Notice("scores", f"scored {len(table.checkpoints)} checkpoints and the base model{said}")


def child_trainer(gpus: list[int]) -> TrainerFactory:
    """A factory training in a child process (`hone train`, with `--gpus N` on several of `gpus`, NVML indices; all
    the child sees when empty), its events read back from the run folder (hone.core.api.child_run; no torch in
    this process). The child keeps training when the window closes."""

    def train(
        config: RunConfig, control: RunControl, resume: Path | None = None, data_changed: str = "refuse"
    ) -> Iterable[Event]:
        from hone.core.api.child_run import train_in_child

        return train_in_child(config, control, resume, gpus=list(gpus), data_changed=data_changed)

    return train


class TrainWorker(QObject):
    """Runs the core trainer and re-emits each of its events. Any exception becomes a RunFailed event."""

    event = Signal(object)
    finished = Signal()

    def __init__(
        self,
        config: RunConfig,
        control: RunControl,
        trainer: TrainerFactory = core_trainer,
        resume: Path | None = None,
        data_changed: str = "refuse",
    ):
        super().__init__()
        self._config, self._control, self._trainer, self._resume = config, control, trainer, resume
        # only a factory that takes the choice is given it (test doubles take config, control, resume)
        self._extra = {"data_changed": data_changed} if data_changed != "refuse" else {}
        if self._extra and not _accepts(trainer, "data_changed"):
            raise TypeError(f"{trainer} takes no data_changed")

    @Slot()
    def run(self) -> None:
        ended = False
        try:
            for event in self._trainer(self._config, self._control, self._resume, **self._extra):
                ended = ended or isinstance(event, (RunFinished, RunFailed))
                self.event.emit(event)
            ended = ended or self._control.detached  # a run in its own process goes on without this window
        except Exception as e:
            error = describe_exception(e)
            self.event.emit(RunFailed(reason=error.message, advice=error.advice, details=error.details))
            ended = True
        finally:
            if not ended:
                self.event.emit(
                    RunFailed(
                        reason="the run ended without saying how", advice="see the log; this is a bug worth reporting"
                    )
                )
            self.finished.emit()


class TrainSession(QObject):
    """The GUI's handle on one training run at a time: start it on a QThread, pause/resume/stop it through a
    RunControl, and receive every event on the GUI thread through `event`."""

    event = Signal(object)
    running_changed = Signal(bool)

    def __init__(self, trainer: TrainerFactory | None = None, parent: QObject | None = None):
        super().__init__(parent)
        # No trainer given: the core trainer, in a process of its own (stopped through a file it watches, on Linux
        # and Windows alike: hone.core.train.child_run). Loading a model and its tokenizer holds the GIL in single
        # calls of a hundred milliseconds and more, so a run on a thread of the window's process froze the window for
        # 250-630 ms while it loaded (2 CPU cores).
        self._trainer = trainer or core_trainer
        self._child_by_default = trainer is None
        self._thread: QThread | None = None
        self._worker: TrainWorker | None = None
        self.control: RunControl | None = None
        self.config: RunConfig | None = None
        self.resume_dir: Path | None = None  # the run folder the last start continued, if it was a resume
        self.gpus: list[int] = []  # the GPUs the run was given (NVML indices); empty: the first
        self._in_child = self._outlives_window = False

    @property
    def is_running(self) -> bool:
        return self._thread is not None

    @property
    def can_pause(self) -> bool:
        """A run on several GPUs cannot pause: its processes would wait for each other in the gradient exchange."""
        return len(self.gpus) <= 1

    @property
    def in_child(self) -> bool:
        """The run trains in a process of its own (`hone train`), which this window follows."""
        return self._in_child

    @property
    def outlives_window(self) -> bool:
        """The run may go on training after the window closes: it was started to (`background`), or it trains on
        GPUs the window's process does not use."""
        return self._outlives_window

    def start(
        self,
        config: RunConfig,
        resume: Path | None = None,
        data_changed: str = "refuse",
        gpus: list[int] | None = None,
        background: bool = False,
    ) -> None:
        """Start a run (or continue the one in `resume`, on changed training data as `data_changed` says). On Linux
        the core trainer runs in a child process (`hone train`) followed from a thread; elsewhere, and for a
        trainer given to the session, on the thread itself. On several GPUs (`gpus`, NVML indices), on one other
        than GPU 0, or with `background`, the run trains in a child process that may outlive the window."""
        if self.is_running:
            raise RuntimeError("a run is already going; stop it first")
        self.config, self.resume_dir, self.gpus = config, resume, list(gpus or [])
        self._outlives_window = background or (bool(self.gpus) and self.gpus != [0])
        self._in_child = self._outlives_window or self._child_by_default
        trainer = child_trainer(self.gpus) if self._in_child else self._trainer
        self.control = RunControl()
        self._thread = QThread()
        self._thread.setObjectName("trainer")
        self._worker = TrainWorker(config, self.control, trainer, resume, data_changed)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.event.connect(self._relay)
        self._worker.finished.connect(self._thread.quit)
        self._thread.finished.connect(self._ended)
        self._thread.start()
        self.running_changed.emit(True)

    def resume_run(self, run_dir: Path, data_changed: str = "refuse", max_steps: int = 0) -> None:
        """Continue a stopped or crashed run from its last checkpoint, with the config it was started with;
        `data_changed` (restart-epoch | continue) when its training data changed and the user chose how to go on;
        `max_steps` lengthens a run that has finished (`hone train --resume RUN_DIR --set train.max_steps=M`)."""
        run_dir = Path(run_dir)
        config = RunConfig.load(run_dir / "config.toml")
        if max_steps:
            config = config.with_overrides([f"train.max_steps={int(max_steps)}"])
        self.start(config, resume=run_dir, data_changed=data_changed)

    def pause(self) -> None:
        if self.control:
            self.control.pause()

    def resume(self) -> None:
        if self.control:
            self.control.resume()

    def stop(self) -> None:
        """Ask the run to stop after its current step; it saves a checkpoint and the adapter first."""
        if self.control:
            self.control.stop()

    def detach(self) -> None:
        """Stop following a run that may outlive the window; it goes on (the Runs page follows it again)."""
        if self.control and self.outlives_window:
            self.control.detach()

    def wait(self, ms: int = 60_000) -> bool:
        return self._thread.wait(ms) if self._thread else True

    @Slot(object)
    def _relay(self, event: Event) -> None:
        self.event.emit(event)

    @Slot()
    def _ended(self) -> None:
        self._thread.deleteLater()
        self._worker.deleteLater()
        self._thread = self._worker = None
        self.running_changed.emit(False)


# How long the Studio holds a logoff or shutdown for its runs to stop after their step and save. Windows ends an app
# that holds it past ~5 s unless the user waits on its "apps are preventing shutdown" screen; X11 session managers
# wait longer. A LoRA run's checkpoint and adapter take a second or two after the step in flight.
SESSION_END_WAIT_S = 20.0


def save_runs_at_session_end(sessions: Iterable[TrainSession], wait_s: float = SESSION_END_WAIT_S) -> bool:
    """The desktop session ends (QGuiApplication.commitDataRequest: logoff, shutdown): ask each session's run to
    stop after its step and save, as the Stop button does, and wait up to `wait_s` in all. True when each ended."""
    running = [session for session in sessions if session.is_running]
    for session in running:
        session.stop()
    deadline = time.monotonic() + wait_s
    # a run's thread quits through a call queued to this thread, and its last events come the same way: run this
    # thread's events while waiting (a blocking QThread.wait here would sit out the whole wait)
    while any(session.is_running for session in running) and time.monotonic() < deadline:
        QCoreApplication.processEvents(QEventLoop.AllEvents, 50)
        time.sleep(0.01)
    return not any(session.is_running for session in running)


# ---------------------------------------------------------------------------------------------------------------
# Telemetry


class _TelemetryWorker(QObject):
    sample = Signal(object)

    def __init__(self, interval_ms: int):
        super().__init__()
        self._interval_ms = interval_ms
        self._telemetry = None
        self._timer: QTimer | None = None

    @Slot()
    def start(self) -> None:
        from hone.core.api import Telemetry

        self._telemetry = Telemetry()
        self._timer = QTimer()  # created here so it lives on (and fires in) the telemetry thread
        self._timer.timeout.connect(self._read)
        self._timer.start(self._interval_ms)
        self._read()

    @Slot()
    def stop(self) -> None:
        if self._timer:
            self._timer.stop()
        if self._telemetry:
            self._telemetry.close()

    @Slot()
    def _read(self) -> None:
        self.sample.emit(self._telemetry.sample())


class TelemetryPoller(QObject):
    """Samples the GPU (or system memory) on its own thread and timer; `sample` delivers TelemetrySample."""

    sample = Signal(object)

    # NVML refreshes utilization about once a second; polling faster shows no new information.
    INTERVAL_MS = 1000

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("telemetry")
        self._worker = _TelemetryWorker(interval_ms)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.start)
        self._worker.sample.connect(self._relay)
        self.last = None

    def start(self) -> None:
        if not self._thread.isRunning():
            self._thread.start()

    def shutdown(self) -> None:
        if self._thread.isRunning():
            QMetaObject.invokeMethod(self._worker, "stop", Qt.BlockingQueuedConnection)
            self._thread.quit()
            self._thread.wait(5000)

    @Slot(object)
    def _relay(self, sample) -> None:
        self.last = sample
        self.sample.emit(sample)

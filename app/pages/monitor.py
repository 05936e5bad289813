"""Monitor page: live charts and numbers of the running (or an opened) run, the log, Pause / Resume / Stop."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QMessageBox, QPlainTextEdit, QProgressBar, QPushButton, QWidget

from hone.app.model_names import model_name
from hone.app.pages.base import Page
from hone.app.pages.monitor_controls import RunControls
from hone.app.pages.monitor_failures import explain
from hone.app.pages.monitor_method_charts import MethodCharts
from hone.app.pages.monitor_next import RunNextSteps
from hone.app.pages.monitor_past import SMOOTHING, PastRuns
from hone.app.pages.monitor_replay import FolderReplay, SmoothedLoss
from hone.app.pages.monitor_samples import SamplesPanel
from hone.app.pages.monitor_tiles import update_tiles
from hone.app.theme import Palette, icon
from hone.app.widgets.charts import BarChart, LiveChart, SeriesBuffer, mark_label, power_of_ten
from hone.app.widgets.common import Card, StatTile, human_count, human_duration, label, set_role
from hone.app.widgets.log_viewer import LogViewer, open_log_viewer
from hone.core.api import speed_choice
from hone.core.events import (
    CheckpointSaved,
    DatasetReport,
    EvalMetrics,
    Event,
    Notice,
    RunFailed,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StepMetrics,
)

if TYPE_CHECKING:
    from hone.core.api import StepColumns

# One chart redraws per tick, in turn: a chart's repaint costs 10-50 ms of the GUI thread on a loaded CPU, so
# repainting all of them at once would stall the window; in turn, each of the five redraws about four times a
# second (the page as a whole twenty), and the longest pause the window sees is one chart's repaint.
FLUSH_INTERVAL_MS = 50
# While a large run is read, a chart (and the numbers) redraw at most this often: they show the run coming in, and
# leave the CPU to the reading (a chart's redraw and repaint cost 10-20 ms; at 20 a second, a third of the replay).
REPLAY_DRAW_S = 1.0
# How often a run trained by another process is read for new lines (a step line is a few hundred bytes).
FOLLOW_INTERVAL_MS = 1000
# The numbers (tiles, progress, ETA) refresh at most this often.
TILES_INTERVAL_S = 0.2
# Step times averaged for the ETA: long enough to ride over eval/checkpoint pauses, short enough to follow change.
ETA_WINDOW = 20
# Step lines in the log at most this often (the charts carry every step).
LOG_STEP_EVERY_S = 2.0
GIB = 2**30
# Palette colours of the per-GPU memory lines, in GPU order (dashed once they run out).
GPU_COLOURS = ("mem_alloc", "mem_device", "speed", "smooth", "eval", "util", "lr", "loss")
# Plot height: two rows of charts, the numbers and the progress fit a 900-pixel-high window.
CHART_HEIGHT = 210


# Which MonitorPage method takes which event into the page; other events only refresh the numbers.
EVENT_HANDLERS: dict[type[Event], str] = {
    RunStarted: "_on_started",
    StepMetrics: "_step",
    EvalMetrics: "_on_eval",
    DatasetReport: "_on_dataset",
    Notice: "_on_notice",
    CheckpointSaved: "_on_checkpoint",
    RunPaused: "_on_paused",
    RunResumed: "_on_resumed",
    RunFinished: "_on_finished",
    RunFailed: "_on_failed",
}


class MonitorPage(RunControls, PastRuns, Page):
    name = "monitor"
    title = "Monitor"
    subtitle = "No run yet. Start one on the Train page, or open a past run from Runs."
    icon_name = "monitor"

    failure_shown = Signal(object)  # RunFailed, after its dialog opened
    run_shown = Signal(str)  # a run folder opened with show_run, once all of its metrics.jsonl is in the page
    status_changed = Signal(str)  # idle | starting | running | paused | finished | stopped | failed | interrupted

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.failure_dialog: QMessageBox | None = None
        self.show_dialogs = True
        self.live = False  # showing the session's run (not a past run opened from Runs)

        self.pause_button = QPushButton("Pause")
        self.pause_button.clicked.connect(self._toggle_pause)
        self.stop_button = set_role(QPushButton("Stop"), "danger")
        self.stop_button.setToolTip("Stop after the current step; the adapter and a checkpoint are saved.")
        self.stop_button.clicked.connect(self.stop)
        self.more_button = QPushButton("Train more steps…")
        self.more_button.setToolTip("The run reached its last step: train it further from there; its charts go on.")
        self.more_button.clicked.connect(self.train_more_steps)
        self.header.actions.addWidget(self.more_button)
        self.header.actions.addWidget(self.pause_button)
        self.header.actions.addWidget(self.stop_button)

        progress = Card()
        row = QHBoxLayout()
        self.status_pill = label("Idle", "pill")
        self.progress_text = label("", "muted")
        row.addWidget(self.status_pill)
        row.addWidget(self.progress_text, 1)
        self.eta_text = label("", "muted")
        row.addWidget(self.eta_text)
        progress.body.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        progress.body.addWidget(self.progress)
        self.next_steps = RunNextSteps()  # Chat with it / Evaluate / Export, once the run ended with an adapter
        progress.body.addWidget(self.next_steps)
        self.body.addWidget(progress)

        tiles = QHBoxLayout()
        tiles.setSpacing(12)
        self.loss_tile = StatTile("Loss")
        self.speed_tile = StatTile("Tokens / s")
        self.memory_tile = StatTile("GPU memory")
        self.gpu_tile = StatTile("GPU")
        for tile in (self.loss_tile, self.speed_tile, self.memory_tile, self.gpu_tile):
            tiles.addWidget(tile)
        self.body.addLayout(tiles)

        self.loss_chart = LiveChart("Loss", y_format="{:.4f}", steps=True)
        self.loss_chart.add_line("raw", "loss", "loss", width=1.2)
        self.loss_chart.add_line("smooth", "smoothed", "smooth", width=2.4)
        self.loss_chart.add_line("eval", "eval loss", "eval", width=2.0, symbol="o")
        self.speed_chart = LiveChart("Throughput", unit="tokens/s", y_format="{:,.0f}", steps=True)
        self.speed_chart.add_line("tps", "tokens/s", "speed")
        self.memory_chart = LiveChart("Memory", unit="GiB", y_format="{:.2f}")
        self.memory_chart.add_line("device", "device used", "mem_device", width=2.0)
        self.memory_chart.add_line("reserved", "reserved", "mem_reserved", width=1.6, dashed=True)
        self.memory_chart.add_line("allocated", "allocated (peak)", "mem_alloc", width=2.0)
        self.util_chart = LiveChart("GPU utilization", unit="%", y_format="{:.0f}")
        self.util_chart.add_line("util", "utilization", "util")
        self.lr_chart = LiveChart("Learning rate", y_format=power_of_ten, steps=True, power_of_ten_axis=True)
        self.lr_chart.add_line("lr", "learning rate", "lr")
        self.expert_chart = BarChart("Expert load (tokens routed per expert)")
        self.expert_chart.hide()
        self.memory_chart.plot.getPlotItem().setLabel("bottom", "seconds")
        self.util_chart.plot.getPlotItem().setLabel("bottom", "seconds")
        self.method_charts = MethodCharts()  # the training method's own numbers (preference, GRPO runs)
        self.charts = [self.loss_chart, self.speed_chart, self.memory_chart, self.util_chart, self.lr_chart]
        for chart in (*self.charts, self.expert_chart):
            chart.plot.setFixedHeight(CHART_HEIGHT)

        grid = QGridLayout()
        grid.setSpacing(12)
        grid.addWidget(self.loss_chart, 0, 0, 1, 2)
        grid.addWidget(self.speed_chart, 0, 2)
        grid.addWidget(self.memory_chart, 1, 0)
        grid.addWidget(self.util_chart, 1, 1)
        grid.addWidget(self.lr_chart, 1, 2)
        grid.addWidget(self.expert_chart, 2, 0, 1, 3)
        for column in range(3):
            grid.setColumnStretch(column, 1)
        self.body.addLayout(grid)
        self.body.addWidget(self.method_charts)
        self.charts += self.method_charts.charts  # cleared, drawn and styled with the others
        self.samples_panel = SamplesPanel()  # train.sample_prompts' answers at each evaluation
        self.body.addWidget(self.samples_panel)

        log_card = Card("Log")
        self.log_button = QPushButton("Open full log")
        self.log_button.setToolTip("The run's whole train.log: search it, copy it, or open it in an editor.")
        self.log_button.clicked.connect(self.open_full_log)
        log_card.header.addWidget(self.log_button)
        self.log_viewer: LogViewer | None = None  # the last one opened
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)  # a long run's log stays bounded in memory
        self.log.setMinimumHeight(140)
        log_card.body.addWidget(self.log)
        self.body.addWidget(log_card)

        # Memory re-plans not yet on the memory chart: the planner's fit (step 0) comes before RunStarted, whose
        # reset must not drop it. Cleared when a new run is followed or opened.
        self._unplaced_marks: list[Notice] = []
        self._reset()
        self.flush_timer = QTimer(self)
        self.flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self.flush_timer.timeout.connect(self._tick)
        self._next_chart = 0
        self._tiles_at = 0.0
        self._drawn_at = 0.0  # when a chart was last redrawn
        self.flush_timer.start()
        # A run opened from Runs is read off the GUI thread when large; one that another process (hone train, another
        # window) is still training is then followed: its metrics.jsonl is read as it grows.
        self.replay = FolderReplay(self._take, self._reserve, self)
        self.replay.done.connect(self._replayed)
        self.shown_dir: Path | None = None  # the run folder show_run is reading
        self.following: Path | None = None
        self.follow_timer = QTimer(self)
        self.follow_timer.setInterval(FOLLOW_INTERVAL_MS)
        self.follow_timer.timeout.connect(self._follow_tick)
        state.session.event.connect(self._live_event)
        state.session.running_changed.connect(self._running_changed)
        self._update_buttons()

    @property
    def status(self) -> str:
        """The run's state, in the words of hone.app.run_status (the badge and Runs say the same)."""
        return self.__dict__.get("_status", "idle")

    @status.setter
    def status(self, value: str) -> None:
        if value != self.__dict__.get("_status"):
            self.__dict__["_status"] = value
            self.status_changed.emit(value)

    # ---- feeding ----
    def _reset(self) -> None:
        for key in [k for k in self.memory_chart.series if k.startswith("gpu")]:
            self.memory_chart.remove_line(key)
        for chart in self.charts:
            chart.clear()
        self.expert_chart.clear()
        self.expert_chart.hide()
        self.method_charts.reset()
        self.samples_panel.clear()
        self.loss_chart.set_empty_text("Waiting for the first step")
        self.memory_chart.set_empty_text("Device memory appears here while a run trains")
        self.util_chart.set_empty_text("GPU load appears here while a run trains on an NVIDIA GPU")
        self.smoother = SmoothedLoss(SMOOTHING)
        self.step_times: deque[float] = deque(maxlen=ETA_WINDOW)
        self.started: RunStarted | None = None
        self.t0: float | None = None  # when the run first started: a resumed run's time axis continues from it
        self.last_step: StepMetrics | None = None
        self.ended: RunFinished | RunFailed | None = None
        self.expert_totals: list[float] = []
        self._began = SeriesBuffer()  # step -> seconds on the memory chart when the step after it began
        self.status = "idle"
        self._log_step_at = 0.0
        self._tiles_dirty = False
        self._pending = ""  # "Pausing…" / "Resuming…" until the trainer confirms at its next step boundary

    def _live_event(self, event: Event) -> None:
        if self.live:
            self.handle(event)

    def handle(self, event: Event) -> None:
        """Take one core event into the charts, numbers and log (live or replayed)."""
        handler = EVENT_HANDLERS.get(type(event))
        if handler is not None:
            getattr(self, handler)(event)
        self._tiles_dirty = True
        self._update_buttons()

    def _on_started(self, event: RunStarted) -> None:
        if event.resumed_from_step and self.live and self.last_step is None:
            self._replay_before(event)  # live: the steps before the checkpoint come from the run folder
        if event.resumed_from_step and self.last_step is not None:
            self._continue_at(event.resumed_from_step)
        else:
            self._reset()
            self.t0 = event.time
        self._began.append(event.resumed_from_step, self._seconds(event))
        self._place_marks()
        self.started = event
        self.ended = None
        self.status = "running"
        self.header.title.setText("Monitor")
        where = f"{model_name(event.model)} on {event.device} ({event.dtype})"
        self.header.subtitle.setText(f"{Path(event.run_dir).name} · {where}")
        trainable = f"{human_count(event.params_trainable)} of {human_count(event.params_total)} parameters"
        self._log(
            event, f"Run started on {event.device} ({event.dtype}): {event.total_steps} steps, {trainable} trained"
        )
        if event.resumed_from_step:
            self._log(event, f"Resumed from step {event.resumed_from_step}")
        for path, choice in event.speed_paths.items():  # as train.log says it: a GPU-only path on a CPU is "off (CPU)"
            self._log(event, f"{path}: {speed_choice(event.device, choice)}")
        self.expert_chart.setVisible(event.is_moe)
        self.method_charts.set_method(event.config)
        # the folder opened or followed (a moved or copied run's events name where it was trained)
        self.samples_panel.set_run(self.following or self.shown_dir or event.run_dir)

    def _on_eval(self, event: EvalMetrics) -> None:
        self.samples_panel.refresh()  # samples.jsonl has this evaluation's answers (written before the event)
        self.loss_chart.append("eval", event.step, event.loss)
        self._log(event, f"Eval at step {event.step}: loss {event.loss:.4f} over {event.tokens:,} tokens")

    def _on_dataset(self, event: DatasetReport) -> None:
        skipped = sum(event.skipped.values())
        self._log(
            event,
            f"Data ({event.split}): {event.rows_kept:,} of {event.rows_read:,} rows kept, "
            f"{skipped:,} skipped, {event.truncated:,} truncated, {event.tokens:,} tokens",
        )
        for reason, count in event.skipped.items():
            self._log(event, f"  skipped {count:,}: {reason}")

    def _on_notice(self, event: Notice) -> None:
        self._log(event, f"{'Warning: ' if event.level == 'warning' else ''}{event.topic}: {event.message}")
        if event.topic == "memory" and event.step is not None:
            self._unplaced_marks.append(event)
            self._place_marks()

    def _on_checkpoint(self, event: CheckpointSaved) -> None:
        self._log(event, f"Checkpoint at step {event.step}: {event.path}")

    def _on_paused(self, event: RunPaused) -> None:
        self.status = "paused"
        self._pending = ""
        self._log(event, f"Paused after step {event.step}")

    def _on_resumed(self, event: RunResumed) -> None:
        self.status = "running"
        self._pending = ""
        self._log(event, f"Resumed at step {event.step}")

    def _on_finished(self, event: RunFinished) -> None:
        self.ended = event  # before the status, which the badge reads it with
        self.status = "stopped" if event.stopped else "finished"
        eval_text = f", eval loss {event.eval_loss:.4f}" if event.eval_loss is not None else ""
        self._log(
            event,
            f"{'Stopped' if event.stopped else 'Finished'} at step {event.step} after "
            f"{human_duration(event.elapsed)}: loss {event.final_loss:.4f}{eval_text}. "
            f"Adapter: {event.adapter_dir}",
        )

    def _on_failed(self, event: RunFailed) -> None:
        # str() every field shown: a RunFailed built from a damaged line may hold a number or a list where text
        # belongs, and a non-str reaching a Qt str slot aborts the process.
        self.ended = event
        self.status = "interrupted" if event.interrupted else "failed"
        reason, next_step = explain(event)
        self.header.subtitle.setText(f"Failed: {reason}")
        if self.last_step is None:
            self.loss_chart.set_empty_text("The run failed before its first step; the log below says why")
        self._log(event, f"Failed at step {event.step}: {reason}")
        self._log(event, f"What to do: {next_step}")
        if event.details:
            self.log.appendPlainText(str(event.details).rstrip())
        if self.show_dialogs:
            self._show_failure(event)

    def _step(self, event: StepMetrics) -> None:
        self.loss_chart.set_empty_text("")
        self.last_step = event
        self.loss_chart.append("raw", event.step, event.loss)
        self.loss_chart.append("smooth", event.step, self.smoother.add(event.loss))
        self.speed_chart.append("tps", event.step, event.tokens_per_s)
        self.lr_chart.append("lr", event.step, event.lr)
        self.method_charts.add_step(event)
        seconds = self._seconds(event)
        if len(event.mem_by_gpu) > 1:  # a run on several GPUs: one line per GPU (each process's peak)
            for index, peak in enumerate(event.mem_by_gpu):
                self._gpu_line(index)
                self.memory_chart.append(f"gpu{index}", seconds, peak / GIB)
            self.memory_chart.append("reserved", seconds, event.mem_reserved / GIB)
        elif event.mem_allocated or event.mem_reserved:
            self.memory_chart.append("allocated", seconds, event.mem_allocated / GIB)
            self.memory_chart.append("reserved", seconds, event.mem_reserved / GIB)
        self._began.append(event.step, seconds)
        if self._unplaced_marks:
            self._place_marks()
        if event.expert_load:
            self._add_expert_load(event.expert_load, restart=False)
        self.step_times.append(event.step_time)
        self._log_step(event)

    def _steps(self, block: StepColumns, last_of_run: bool) -> None:
        """A run of steps read from the run folder (StepColumns), taken in at once: what `_step` does for each, on
        whole columns. The numbers and the ETA come from the block's last lines, read whole; so do the log's step
        lines, and only where no more steps follow (`last_of_run`): a replayed million steps are on the charts, not
        in the log."""
        if not len(block):
            return
        self.loss_chart.set_empty_text("")
        steps = block.step.astype(np.float64)
        self.loss_chart.extend("raw", steps, block.loss)
        self.loss_chart.extend("smooth", steps, self.smoother.extend(block.loss))
        self.speed_chart.extend("tps", steps, block.tokens_per_s)
        self.lr_chart.extend("lr", steps, block.lr)
        self.method_charts.add_steps(steps, getattr(block, "method", {}), getattr(block, "rewards", {}))
        seconds = block.time - self.t0 if self.t0 is not None else np.zeros(len(block))
        self._memory_points(block, seconds)
        self._began.extend(steps, seconds)
        if self._unplaced_marks:
            self._place_marks()
        if len(block.expert_load):
            self._add_expert_load(block.expert_load, restart=block.experts_changed)
        for event in block.last:
            self.step_times.append(event.step_time)
            if last_of_run:
                self._log_step(event)
        self.last_step = block.last[-1] if block.last else self.last_step

    def _memory_points(self, block: StepColumns, seconds: np.ndarray) -> None:
        """The memory chart's points of a block: as `_step` draws them, one line per GPU where a step lists
        several."""
        gpus = block.mem_by_gpu
        several = np.sum(~np.isnan(gpus), axis=1) > 1 if gpus.shape[1] else np.zeros(len(block), dtype=bool)
        for index in range(gpus.shape[1]):
            rows = several & ~np.isnan(gpus[:, index])
            if rows.any():
                self._gpu_line(index)
                self.memory_chart.extend(f"gpu{index}", seconds[rows], gpus[rows, index] / GIB)
        alone = ~several & ((block.mem_allocated != 0) | (block.mem_reserved != 0))
        self.memory_chart.extend("allocated", seconds[alone], block.mem_allocated[alone] / GIB)
        reserved = several | alone
        self.memory_chart.extend("reserved", seconds[reserved], block.mem_reserved[reserved] / GIB)

    def _gpu_line(self, index: int) -> None:
        key = f"gpu{index}"
        if key not in self.memory_chart.series:
            self.memory_chart.add_line(
                key,
                f"GPU {index} (peak)",
                GPU_COLOURS[index % len(GPU_COLOURS)],
                width=2.0,
                dashed=index >= len(GPU_COLOURS),
            )

    def _add_expert_load(self, load, restart: bool) -> None:
        """Add tokens per expert to the run's totals (which start again when the number of experts changes)."""
        if restart or len(self.expert_totals) != len(load):
            self.expert_totals = [0.0] * len(load)
        self.expert_totals = [float(a) + float(b) for a, b in zip(self.expert_totals, load)]
        self.expert_chart.set_values(self.expert_totals)
        self.expert_chart.show()

    def _log_step(self, event: StepMetrics) -> None:
        if event.time - self._log_step_at >= LOG_STEP_EVERY_S:
            self._log_step_at = event.time
            self._log(
                event,
                f"step {event.step}/{event.total_steps}  loss {event.loss:.4f}  lr {event.lr:.2e}  "
                f"grad norm {event.grad_norm:.3f}  {event.tokens_per_s:,.0f} tokens/s",
            )

    def _place_marks(self) -> None:
        """Mark each memory re-plan on the memory chart where its step began, once that time is known: a notice
        for step N ("from step N on") stands where step N-1 ended; step 0 (before the first step) at the start."""
        waiting = []
        for notice in self._unplaced_marks:
            began = np.flatnonzero(self._began.x == max(notice.step - 1, 0))
            if not len(began):
                waiting.append(notice)
                continue
            seconds = float(self._began.y[began[-1]])  # the latest: a resumed run trains a step again
            when = f"Step {notice.step}" if notice.step else "Before the first step"
            message = str(notice.message)
            self.memory_chart.add_mark(seconds, mark_label(message), f"{when}: {message}")
        self._unplaced_marks = waiting

    def telemetry(self, sample) -> None:
        """A TelemetrySample from the poller: device memory and utilization over the run's time axis."""
        self._sample = sample
        if self.live and self.status in ("running", "paused") and self.started:
            seconds = time.time() - self.started.time
            self.memory_chart.append("device", seconds, sample.memory_used / GIB)
            if sample.utilization is not None:
                self.util_chart.append("util", seconds, sample.utilization)
        self._tiles_dirty = True

    def flush(self) -> None:
        """Redraw everything that changed (replays, screenshots, showing the page)."""
        if not self._drawable():
            return
        for chart in (*self.charts, self.expert_chart):
            chart.flush()
        self._tiles_dirty = False
        self._update_tiles()

    def _tick(self) -> None:
        """The timer's tick: redraw the next chart that has new points, and the numbers when due."""
        if not self._drawable():
            return
        charts = (*self.charts, self.expert_chart)
        now = time.monotonic()
        drawing = not self.drawing_in_turn and (not self.replay.busy or now - self._drawn_at >= REPLAY_DRAW_S)
        for offset in range(len(charts) if drawing else 0):
            chart = charts[(self._next_chart + offset) % len(charts)]
            if chart.flush():
                self._next_chart = (self._next_chart + offset + 1) % len(charts)
                self._drawn_at = now
                break
        every = REPLAY_DRAW_S if self.replay.busy else TILES_INTERVAL_S  # a replay's numbers change all the time
        if self._tiles_dirty and now - self._tiles_at >= every:
            self._tiles_dirty = False
            self._tiles_at = now
            self._update_tiles()

    def _drawable(self) -> bool:
        # while the page is hidden the points only accumulate (drawing them would cost the GUI thread for nothing)
        return self.isVisible() or not self.window().isVisible()

    def _running_changed(self, running: bool) -> None:
        if running:
            self._stop_following()
            self.live = True
            self._unplaced_marks.clear()
            self._reset()
            self.status = "starting"
            self.header.subtitle.setText("Loading the model and data…")
            self.log.clear()
            self.log.appendPlainText("Loading the model and data…")
        else:
            self._pending = ""
            if self.status in ("starting", "running", "paused"):  # the thread ended without a final event
                self.status = "stopped"
        self._update_buttons()
        self._tiles_dirty = True

    def _update_tiles(self) -> None:
        update_tiles(self)

    def _seconds(self, event: Event) -> float:
        return event.time - self.t0 if self.t0 is not None else 0.0

    def _log(self, event: Event, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
        self.log.appendPlainText(f"{stamp}  {text}")
        self.log.moveCursor(QTextCursor.End)

    def run_dir(self) -> Path | None:
        """The folder of the run the page shows (live or opened), once known."""
        return Path(self.started.run_dir) if self.started is not None else self.shown_dir

    def open_full_log(self) -> None:
        if (run_dir := self.run_dir()) is not None:
            self.log_viewer = open_log_viewer(run_dir, self)

    def shown(self) -> None:
        self.flush()

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        for chart in (*self.charts, self.expert_chart):
            chart.apply_palette(palette)
        self.stop_button.setIcon(icon("stop", palette.danger, 14))
        self._update_buttons()

"""The Monitor's runs from a folder: a resumed run's earlier steps, a past run opened from Runs, and a run another
process trains, followed live and paused or stopped from here (through its folder: hone.core.api.request_pause,
request_stop). A mixin of MonitorPage: these read and draw into the page's own charts and numbers."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer

from hone.app.pages.monitor_replay import SmoothedLoss
from hone.core.events import RunStarted

# Weight of history in the smoothed loss (debiased for the first steps): 0.8 follows a short run's trend within
# a few steps while still averaging out step-to-step noise.
SMOOTHING = 0.8
# The pause between drawing one chart of a replayed run and the next: longer than a frame (Qt paints a window at
# most once per screen refresh, 16 ms at 60 Hz, every widget changed since in one go), so each chart is painted alone.
DRAW_TURN_MS = 20
INTERRUPTED_NOTE = "The process training this run ended before the run did; resume it from Runs."


class PastRuns:
    """show_run, following, a resumed run's earlier steps; MonitorPage supplies the charts, `handle` and `_steps`."""

    follow_controls: tuple[bool, bool] = (False, False)  # a followed run takes (a pause, a stop) from here
    drawing_in_turn = False  # a replayed run's charts are being drawn one per frame (the page's timer waits)
    stop_sent = False

    # ---- resumed runs ----
    def _replay_before(self, started: RunStarted) -> None:
        """Take in what the run's folder holds from before this (resumed) start."""
        from hone.core.api import MethodColumnsReader, StepColumns

        show_dialogs, self.show_dialogs = self.show_dialogs, False
        try:
            items = MethodColumnsReader(started.run_dir).read()
            for index, earlier in enumerate(items):
                if isinstance(earlier, RunStarted) and earlier.time >= started.time:
                    break
                if isinstance(earlier, StepColumns):
                    following = items[index + 1] if index + 1 < len(items) else None
                    self._steps(earlier, last_of_run=not isinstance(following, StepColumns))
                else:
                    self.handle(earlier)
        finally:
            self.show_dialogs = show_dialogs

    def _continue_at(self, step: int) -> None:
        """A resumed run continues from its checkpoint at `step`: keep every point up to it, drop the steps after
        it (they are trained again), and smooth the loss on from the kept points."""
        for chart in (self.loss_chart, self.speed_chart, self.lr_chart, *self.method_charts.charts):
            chart.keep_until(step)
        self.smoother = SmoothedLoss(SMOOTHING)
        steps, raw = self.loss_chart.points("raw")
        self.loss_chart.set_points("smooth", steps, self.smoother.extend(raw))
        self.step_times.clear()

    # ---- past runs ----
    def show_run(self, run_dir: str | Path) -> None:
        """Replay a run's metrics.jsonl into the charts (no dialogs): a small one at once, a large one off the GUI
        thread (`run_shown` says when it is all in). A run another process is still training is then followed: what
        it appends shows as it comes, until it finishes or its process ends."""
        if self.state.session.is_running:
            return
        self._stop_following()
        self.live = False
        self._unplaced_marks.clear()
        self._reset()
        self.log.clear()
        self.shown_dir = Path(run_dir)
        self.loss_chart.set_empty_text("Reading the run's metrics…")
        self.replay.start(run_dir)

    def _take(self, item, last_of_run: bool) -> None:
        """One item the replay read: an event, or a run of steps."""
        from hone.core.api import StepColumns

        show_dialogs, self.show_dialogs = self.show_dialogs, False
        try:
            if isinstance(item, StepColumns):
                self._steps(item, last_of_run)
                self._tiles_dirty = True
            else:
                self.handle(item)
        finally:
            self.show_dialogs = show_dialogs

    def _reserve(self, steps: int) -> None:
        """Room for `steps` more points in every per-step series, made before a large replay is taken in."""
        for chart in (self.loss_chart, self.speed_chart, self.lr_chart, self.memory_chart):
            for key, series in chart.series.items():
                if key != "eval":
                    series.buffer.reserve(steps)
        self._began.reserve(steps)

    def _replayed(self) -> None:
        """All that was read is in the page: draw it; a run opened from Runs is then followed while another process
        trains it. After a large read the charts are drawn one per turn of the event loop, each painted before the
        next is thinned, so that no turn holds the window for all of them."""
        if self.replay.large and self.shown_dir is not None and self._drawable():
            self._draw_in_turn([*self.charts, self.expert_chart], self.shown_dir)
        else:
            self._shown()

    def _draw_in_turn(self, charts: list, run_dir: Path) -> None:
        self.drawing_in_turn = run_dir == self.shown_dir
        if not self.drawing_in_turn:  # another run was opened meanwhile
            return
        while charts and not charts.pop(0).flush():
            pass
        if charts:
            QTimer.singleShot(DRAW_TURN_MS, lambda: self._draw_in_turn(charts, run_dir))
        else:
            self.drawing_in_turn = False
            self._shown()

    def _shown(self) -> None:
        from hone.core.api import in_use

        self.flush()
        run_dir = self.shown_dir
        if run_dir is None or self.following is not None:
            return
        self.shown_dir = None
        if self.last_step is None and self.ended is None:
            self.loss_chart.set_empty_text("Waiting for the first step")
        note = self.replay.reader.skipped_note() if self.replay.reader is not None else ""
        if note:
            self.log.appendPlainText(f"{note}: the rest of the run is shown.")
        if self.started is not None and self.ended is None and in_use(run_dir):
            self.following = run_dir
            self.follow_timer.start()
            self.header.subtitle.setText(
                self.header.subtitle.text() + " · following live (training in another process)"
            )
            self.log.appendPlainText("Following this run live: another process is training it.")
            self._read_follow_controls(run_dir)
        elif self.started is not None and self.ended is None:  # said running, and nobody trains it: as Runs says
            self.status = "interrupted"
            self.log.appendPlainText(INTERRUPTED_NOTE)
        if self.method_charts.method == "grpo":  # its latest sampled answers: text the replayed columns do not hold
            self.method_charts.load_samples(run_dir)
        self._update_buttons()
        self.run_shown.emit(str(run_dir))

    def _follow_tick(self) -> None:
        from hone.core.api import in_use

        if self.following is None or self.replay.busy:
            return
        self.replay.read_more()
        if self.ended is not None:
            if self.follow_controls[0]:  # a stop while paused leaves the request; the next start must not see it
                from hone.core.api import request_pause

                request_pause(self.following, paused=False)
            self._stop_following()
        elif in_use(self.following) is False:  # the process ended without a final event (killed)
            self.replay.read_more()
            if self.ended is None:
                self.status = "interrupted"
                self.log.appendPlainText(INTERRUPTED_NOTE)
                self._tiles_dirty = True
            self._stop_following()

    def _stop_following(self) -> None:
        self.follow_timer.stop()
        self.following = None
        self.follow_controls = (False, False)
        self.stop_sent = False
        self.shown_dir = None
        self.replay.cancel()

    # ---- a followed run's Pause and Stop ----
    def _read_follow_controls(self, run_dir: Path) -> None:
        """Whether the followed run's process takes a pause (a run the Studio started watches its folder's pause
        file) and a stop (Ctrl-C's signal, to one process of this computer); read once, as it is followed."""
        from hone.core.api import can_pause, can_stop

        processes = self.started.processes if self.started is not None else 1
        self.follow_controls = (can_pause(run_dir), can_stop(run_dir, processes))

    def pause_followed(self) -> None:
        """Ask the followed run to pause after its step (or to go on); its RunPaused / RunResumed confirms."""
        from hone.core.api import request_pause

        if self.following is None or not self.follow_controls[0] or self._pending:
            return
        pausing = self.status != "paused"
        request_pause(self.following, paused=pausing)
        self._pending = "Pausing…" if pausing else "Resuming…"
        self._update_buttons()

    def stop_followed(self) -> None:
        """Ask the followed run's process to stop after its step; it saves first, and its RunFinished confirms."""
        from hone.core.api import request_stop

        if self.following is None or not self.follow_controls[1] or self.stop_sent:
            return
        self.stop_sent = request_stop(self.following)
        self._pending = ""
        if self.stop_sent:
            self.log.appendPlainText("Asked the process training this run to stop after its step; it saves first.")
        self._update_buttons()

    def follow_buttons(self) -> tuple[bool, bool, str]:
        """(Pause enabled, Stop enabled, why not) for a followed run."""
        can_pause, can_stop = self.follow_controls
        pause = can_pause and self.status in ("running", "paused") and not self._pending and not self.stop_sent
        why = (
            ""
            if can_pause
            else "This run was not started by Hone Studio, so it cannot pause from here; Stop saves a checkpoint "
            "to resume from"
        )
        if not can_stop:
            why = "This run trains in a process this window cannot reach: stop it where it was started (Ctrl-C)"
        return pause, can_stop and not self.stop_sent, why

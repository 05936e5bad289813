"""The Monitor's run controls: Pause / Resume and Stop for the run this window trains or one it follows in another
process, Train more steps on a finished run, and the dialog of a failed one. A mixin of MonitorPage."""

from __future__ import annotations

from pathlib import Path

from hone.app.more_steps import ask_more_steps, train_more
from hone.app.pages.monitor_failures import data_changed_box, failure_box, resume_when_free
from hone.app.theme import icon
from hone.core.events import RunFailed, RunFinished


class RunControls:
    """Needs the page's state, status, ended, following, live, _pending and its buttons (MonitorPage)."""

    def _toggle_pause(self) -> None:
        if self.following is not None:
            self.pause_followed()
            return
        session = self.state.session
        if not session.is_running or self._pending:
            return
        if session.control.paused:
            session.resume()
            self._pending = "Resuming…"
        else:
            session.pause()
            self._pending = "Pausing…"
        self._update_buttons()

    def stop(self) -> None:
        if self.following is not None:
            self.stop_followed()
        elif self.state.session.is_running:
            self.state.session.stop()
            self._pending = ""
            self._update_buttons()

    def _update_buttons(self) -> None:
        session = self.state.session
        stopping = session.control is not None and session.control.stop_requested
        active = session.is_running and self.live
        pause, stop = active and not stopping, active and not stopping
        pause = pause and self.status in ("running", "paused") and session.can_pause and not self._pending
        why = (
            ""
            if session.can_pause
            else "A run on several GPUs cannot pause (its processes "
            "exchange gradients every step); Stop saves a checkpoint to resume from"
        )
        if self.following is not None:  # trained by another process: asked through its folder
            pause, stop, why = self.follow_buttons()
            stopping = self.stop_sent
        self.pause_button.setEnabled(pause)
        self.pause_button.setText(self._pending or ("Resume" if self.status == "paused" else "Pause"))
        self.pause_button.setToolTip(why)
        self.stop_button.setEnabled(stop)
        self.stop_button.setText("Stopping…" if stopping and (active or self.following) else "Stop")
        self.log_button.setEnabled(self.run_dir() is not None)
        self.more_button.setVisible(
            isinstance(self.ended, RunFinished) and not self.ended.stopped and not session.is_running
        )
        self.next_steps.show_for(self.ended, training=session.is_running)
        if self.palette_:
            self.pause_button.setIcon(icon("play" if self.status == "paused" else "pause", self.palette_.text, 14))

    def train_more_steps(self) -> None:
        """Go on with the finished run shown here for the steps the user asks (hone.app.more_steps)."""
        if not isinstance(self.ended, RunFinished) or self.state.session.is_running:
            return
        run_dir = Path(self.ended.run_dir)
        steps = self.ask_more_steps(run_dir.name, self.ended.step)
        if steps:
            train_more(self, self.state, run_dir, self.ended.step, steps)

    def ask_more_steps(self, name: str, step: int) -> int:
        return ask_more_steps(self, name, step)

    def _show_failure(self, event: RunFailed) -> None:
        resumed = self.state.session.resume_dir
        if event.code == "data-changed" and resumed is not None:
            choose = lambda choice: resume_when_free(self.state.session, resumed, choice)  # noqa: E731
            self.failure_dialog = data_changed_box(self, event, choose)
        else:
            self.failure_dialog = failure_box(self, event)
        self.failure_shown.emit(event)

"""Runs page: the history read from run folders, open / resume / delete a run, and several runs compared (their
curves overlaid, the settings that differ, their numbers: hone.app.pages.runs_compare)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QItemSelectionModel, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from hone.app.more_steps import ask_more_steps, train_more
from hone.app.pages.base import Page
from hone.app.pages.runs_compare import MAX_COMPARED, RunComparisonView
from hone.app.run_status import Progress, progress, status_word
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, label, set_role
from hone.app.widgets.log_viewer import LogViewer, open_log_viewer
from hone.core.api import DAMAGED
from hone.core.errors import HoneError
from hone.core.events import Event, EventError, RunFailed, RunStarted, from_line

COLUMNS = ("Run", "Model", "Status", "Steps", "Loss", "Started")
# How much of a failed run's metrics.jsonl is read for its RunFailed event (the last line, or near it): enough for a
# long traceback in its details, little enough that listing many failed runs stays instant.
FAILURE_TAIL_BYTES = 256 * 1024
ENDED = ("finished", "stopped")  # statuses whose loss is the run's final one


def last_failure(run_dir: str | Path) -> RunFailed | None:
    """The run's last RunFailed event, from the end of its metrics.jsonl (None when it holds none)."""
    from hone.core.api import METRICS_FILE

    try:
        with open(Path(run_dir) / METRICS_FILE, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - FAILURE_TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if '"RunFailed"' not in line:
            continue
        try:
            event = from_line(line)
        except EventError:
            continue  # the first line of the tail may be cut, a killed run's last one too; or a line no Hone wrote
        if isinstance(event, RunFailed):
            return event
    return None


class RunsPage(Page):
    name = "runs"
    title = "Runs"
    subtitle = "Every run in the runs folder. Select one to open or resume it, two or more to compare them."
    icon_name = "runs"

    open_requested = Signal(str)  # run dir
    export_best_requested = Signal(str, str)  # run dir, the metric the best checkpoint is picked by

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.summaries: list[Any] = []
        self.failures: dict[str, RunFailed] = {}  # run dir -> why it failed (failed runs only)
        self.states: dict[str, tuple[str, Progress | None]] = {}  # run dir -> (status, where a running run is)
        self._training: Path | None = None  # the folder of the run the session is training, once known
        self.folder_button = QPushButton("Runs folder…")
        self.folder_button.clicked.connect(self._pick_folder)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.header.actions.addWidget(self.folder_button)
        self.header.actions.addWidget(self.refresh_button)

        history = Card("History")
        self.folder_label = label("", "muted", selectable=True)
        history.body.addWidget(self.folder_label)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setMinimumHeight(220)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        history.body.addWidget(self.table)
        actions = QHBoxLayout()
        self.open_button = QPushButton("Open in Monitor")
        self.open_button.clicked.connect(self.open_selected)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setToolTip("Continue the run from its last checkpoint.")
        self.resume_button.clicked.connect(self.resume_selected)
        self.compare_button = set_role(QPushButton("Compare"), "primary")
        self.compare_button.clicked.connect(self.compare_selected)
        self.files_button = QPushButton("Show files")
        self.files_button.clicked.connect(self._open_folder)
        self.log_button = QPushButton("Open full log")
        self.log_button.setToolTip("The selected run's whole train.log: search it, copy it, or open it in an editor.")
        self.log_button.clicked.connect(self.open_full_log)
        self.log_viewer: LogViewer | None = None  # the last one opened
        self.delete_button = set_role(QPushButton("Delete…"), "danger")
        self.delete_button.clicked.connect(self.delete_selected)
        # two rows: six buttons on one row need more than the window's minimum width gives the page
        for button in (self.open_button, self.resume_button, self.compare_button):
            actions.addWidget(button)
        actions.addStretch(1)
        self.best_button = QPushButton("Export best…")
        self.best_button.clicked.connect(self.export_best_selected)
        files = QHBoxLayout()
        for button in (self.best_button, self.files_button, self.log_button):
            files.addWidget(button)
        files.addStretch(1)
        files.addWidget(self.delete_button)
        self.detail = label("", wrap=True, selectable=True)
        self.detail.setTextFormat(Qt.PlainText)  # reasons quote exceptions, which may hold "<" and "&"
        self.empty = label("", "muted", wrap=True)
        history.body.addLayout(actions)
        history.body.addLayout(files)
        history.body.addWidget(self.detail)
        history.body.addWidget(self.empty)
        self.body.addWidget(history)

        self.comparison = RunComparisonView()
        self.body.addWidget(self.comparison)
        self.body.addStretch(1)
        state.session.running_changed.connect(self._running_changed)
        state.session.event.connect(self._session_event)
        self.refresh()
        self._selection_changed()

    # ---- history ----
    @property
    def runs_dir(self) -> Path:
        return Path(self.state.config.output.runs_dir)

    def refresh(self) -> None:
        from hone.core.api import list_runs

        self.folder_label.setText(str(self.runs_dir))
        self.summaries = list_runs(self.runs_dir) if self.runs_dir.is_dir() else []
        self.failures = {
            s.run_dir: failure
            for s in self.summaries
            if s.status == "failed" and (failure := last_failure(s.run_dir)) is not None
        }
        self.states = {s.run_dir: self._state(s) for s in self.summaries}
        self.table.setRowCount(len(self.summaries))
        for row, summary in enumerate(self.summaries):
            status, step = self.states[summary.run_dir]
            for col, text in enumerate(_row_texts(summary, status, step)):
                item = QTableWidgetItem(text)
                if col in (3, 4):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(row, col, item)
            failure = self.failures.get(summary.run_dir)
            if failure is not None:
                advice = f"\nWhat to do: {failure.advice}" if failure.advice else ""
                self.table.item(row, 2).setToolTip(f"{failure.reason}{advice}")
            elif summary.status == DAMAGED:
                self.table.item(row, 2).setToolTip(f"{summary.reason}\nWhat to do: {summary.advice}")
            elif summary.status == "failed":  # no RunFailed near the end of metrics.jsonl: run.json's reason
                self.table.item(row, 2).setToolTip(summary.reason)
        self.empty.setText("" if self.summaries else "No runs yet. Runs you start appear here.")
        self.empty.setVisible(not self.summaries)
        self._selection_changed()

    def _state(self, summary: Any) -> tuple[str, Progress | None]:
        """The run's status as the badge and the Monitor say it, and, for a run that trains now, where it is (its
        run.json is written at checkpoints only)."""
        if summary.status != "running":
            return summary.status, None
        now = progress(summary.run_dir)
        if now.paused:
            return "paused", now
        return ("elsewhere" if self.training_elsewhere(Path(summary.run_dir)) else "running"), now

    def status_of(self, run_dir: Path) -> str:
        """The status word the list shows for `run_dir` ("" when it is not listed)."""
        summary = next((s for s in self.summaries if _same_folder(Path(s.run_dir), Path(run_dir))), None)
        return status_word(self.states[summary.run_dir][0]) if summary is not None else ""

    def selected_dirs(self) -> list[Path]:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        return [Path(self.summaries[row].run_dir) for row in rows]

    def select_dirs(self, folders: list[Path]) -> None:
        """Select the listed runs in these folders (a comparison, for two or more); others are left out."""
        self.refresh()
        wanted = {Path(folder).resolve() for folder in folders}
        self.select([row for row, summary in enumerate(self.summaries) if Path(summary.run_dir).resolve() in wanted])

    def select(self, rows: list[int]) -> None:
        self.table.clearSelection()
        for row in rows:
            self.table.selectionModel().select(
                self.table.model().index(row, 0),
                QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows,
            )

    def _selection_changed(self) -> None:
        chosen = self.selected_dirs()
        busy = self.state.session.is_running
        self.open_button.setEnabled(len(chosen) == 1 and not busy)
        training = [run_dir for run_dir in chosen if self.is_training(run_dir)]
        self.resume_button.setEnabled(len(chosen) == 1 and not busy and not training)
        finished = self._finished(chosen[0]) if len(chosen) == 1 else None
        self.resume_button.setText("Train more steps…" if finished is not None else "Resume")
        self.resume_button.setToolTip(
            f"The run ended at its last step ({finished.step:,}): train it further from there; its charts go on."
            if finished is not None
            else "Continue the run from its last checkpoint."
        )
        self.files_button.setEnabled(len(chosen) == 1)
        self.log_button.setEnabled(len(chosen) == 1)
        self._offer_best(chosen[0] if len(chosen) == 1 else None)
        self.compare_button.setEnabled(2 <= len(chosen) <= MAX_COMPARED)
        self.compare_button.setToolTip(
            f"Compare at most {MAX_COMPARED} runs at once: select fewer."
            if len(chosen) > MAX_COMPARED
            else "Overlay the selected runs' loss, eval loss, speed and memory; list the settings that differ and "
            "their numbers."
        )
        self.delete_button.setEnabled(bool(chosen) and not training)
        if not training:
            self.delete_button.setToolTip("Remove the selected runs' folders from disk.")
        elif self.training_elsewhere(training[0]):
            self.delete_button.setToolTip("This run is training in another process: stop it there before deleting it.")
        else:
            self.delete_button.setToolTip("This run is training: stop it on the Monitor page before deleting it.")
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        summary = self.summaries[rows[0]] if len(rows) == 1 else None
        text = self._detail(summary) if summary is not None else ""
        self.detail.setText(text)
        self.detail.setVisible(bool(text))
        set_role(self.detail, "error" if summary is not None and summary.status in ("failed", DAMAGED) else "")

    def _detail(self, summary: Any) -> str:
        """One run in words: why it failed and what to do, or its final or latest loss."""
        failure = self.failures.get(summary.run_dir)
        if failure is not None:
            advice = failure.advice.strip().rstrip(".")
            text = f"Failed at step {failure.step}: {failure.reason.rstrip('.')}."
            return text + (f"\nWhat to do: {advice[:1].upper()}{advice[1:]}." if advice else "")
        if summary.status == DAMAGED:
            return f"Damaged: {summary.reason}.\nWhat to do: {_sentence(summary.advice)}"
        if summary.status == "failed":  # a folder from before metrics.jsonl kept the advice
            return f"Failed: {summary.reason}" if summary.reason else "Failed."
        loss = summary.final_loss
        if not isinstance(loss, (int, float)):
            return ""
        if summary.status in ENDED:
            return f"Final loss {loss:.4f} after {summary.step:,} steps."
        if summary.status == "interrupted":
            return (
                f"Interrupted at step {summary.step:,} of {summary.total_steps:,} (latest loss {loss:.4f}): "
                f"{summary.reason}. Resume goes on from its newest checkpoint."
            )
        status, now = self.states.get(summary.run_dir, (summary.status, None))
        step, total = (now.step, now.total_steps) if now is not None and now.step >= summary.step else (0, 0)
        step, total = step or summary.step, total or summary.total_steps
        loss = now.loss if now is not None and now.loss is not None else loss
        going = {
            "paused": "it is paused: resume it on the Monitor (Open in Monitor)",
            "elsewhere": "another process trains it now: open it in the Monitor to follow, pause or stop it",
        }.get(status, "it is training now" if self.is_training(Path(summary.run_dir)) else "the run has not ended")
        return f"Latest loss {loss:.4f} at step {step:,} of {total:,}; {going}."

    def is_training(self, run_dir: Path) -> bool:
        """Whether a run trains in `run_dir` now, the session's or another process's (it must not be deleted)."""
        if self.training_elsewhere(run_dir):
            return True
        if not self.state.session.is_running:
            return False
        if self._training is None:  # its RunStarted has not come yet: every run still writing is spared
            summary = next((s for s in self.summaries if Path(s.run_dir) == Path(run_dir)), None)
            return summary is None or summary.status == "running"
        return _same_folder(run_dir, self._training)

    def training_elsewhere(self, run_dir: Path) -> bool:
        """Whether another process (`hone train` in a terminal, another studio) trains in `run_dir` now."""
        summary = next((s for s in self.summaries if Path(s.run_dir) == Path(run_dir)), None)
        if summary is None or summary.status not in ("running", DAMAGED):  # a damaged run.json may be mid-run's
            return False
        from hone.core.api import in_use, read_holder

        if read_holder(run_dir).get("pid") == os.getpid():
            return False  # this studio's own run
        return in_use(run_dir) is not False  # a holder this computer cannot check counts as training

    def _session_event(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._training = Path(event.run_dir)
            self._selection_changed()

    def _running_changed(self, running: bool) -> None:
        if not running:
            self._training = None
            self.refresh()
        else:
            self._selection_changed()

    # ---- actions ----
    def compare_selected(self) -> None:
        """Compare the selected runs (two to MAX_COMPARED), in the list's order; their folders are read off the GUI
        thread."""
        chosen = self.selected_dirs()
        if 2 <= len(chosen) <= MAX_COMPARED:
            self.comparison.compare(chosen)

    def open_selected(self) -> None:
        """Show the selected run in the Monitor; for a damaged one, say first what is damaged (the Monitor reads its
        metrics.jsonl, not run.json)."""
        chosen = self.selected_dirs()
        if len(chosen) != 1:
            return
        damaged = self._damaged(chosen[0])
        if damaged is not None:
            QMessageBox.warning(
                self,
                "Open run",
                f"{damaged.reason}.\n\nThe Monitor shows what the run's metrics.jsonl holds.\n\nWhat to do: "
                f"{_sentence(damaged.advice)}",
            )
        self.open_requested.emit(str(chosen[0]))

    def resume_selected(self) -> None:
        """Continue the selected run from its last checkpoint. A damaged run is resumed only once the user says Yes
        to what is damaged; a config.toml that cannot be read is said in a dialog, and nothing starts."""
        chosen = self.selected_dirs()
        if len(chosen) != 1 or self.state.session.is_running:
            return
        finished = self._finished(chosen[0])
        if finished is not None:  # nothing is left to resume: it would only fail on its own max_steps
            steps = self.ask_more_steps(finished)
            if steps:
                self.train_more(chosen[0], steps)
            return
        damaged = self._damaged(chosen[0])
        if damaged is not None:
            answer = QMessageBox.question(
                self,
                "Resume run",
                f"{damaged.reason}.\n\nA resume reads the run's config.toml and its newest checkpoint, not run.json, "
                "and writes run.json anew. Resume it?",
                QMessageBox.Yes | QMessageBox.No,
                QMessageBox.No,
            )
            if answer != QMessageBox.Yes:
                return
        self._training = chosen[0]  # known before its RunStarted comes: it is being loaded already
        try:
            self.state.session.resume_run(chosen[0])
        except HoneError as e:  # config.toml cannot be read: nothing started
            self._training = None
            advice = f"\n\nWhat to do: {_sentence(e.advice)}" if e.advice else ""
            QMessageBox.warning(self, "Resume run", f"{e.message}{advice}")
            return
        self.state.page_requested.emit("monitor")

    def ask_more_steps(self, summary: Any) -> int:
        """How many steps more to train the finished run `summary` (0: cancelled)."""
        return ask_more_steps(self, Path(summary.run_dir).name, summary.step)

    def train_more(self, run_dir: Path, steps: int) -> None:
        """Resume the finished run in `run_dir` with train.max_steps raised by `steps` (hone.app.more_steps)."""
        finished = self._finished(run_dir)
        if finished is None or self.state.session.is_running:
            return
        self._training = Path(run_dir)  # known before its RunStarted comes: it is being loaded already
        if not train_more(self, self.state, Path(run_dir), finished.step, steps):
            self._training = None

    def _finished(self, run_dir: Path) -> Any:
        """The summary of `run_dir` when it finished (reached its last step), else None."""
        return next(
            (s for s in self.summaries if s.status == "finished" and _same_folder(Path(s.run_dir), run_dir)), None
        )

    def _damaged(self, run_dir: Path) -> Any:
        """The summary of `run_dir` when the list shows it damaged, else None."""
        return next((s for s in self.summaries if s.status == DAMAGED and _same_folder(Path(s.run_dir), run_dir)), None)

    def delete_selected(self) -> None:
        """Remove the selected runs' folders from disk, after asking (No unless the user says Yes). The run in
        training is never removed: its trainer is still writing there."""
        chosen = self.selected_dirs()
        if not chosen or self._refuse_training(chosen):
            return
        if len(chosen) == 1:
            question = (
                f"Delete the run “{chosen[0].name}”?\n\nIts folder, with its checkpoints, adapter and logs, "
                "is removed from disk:"
            )
        else:
            question = (
                f"Delete {len(chosen)} runs: {', '.join(f'“{d.name}”' for d in chosen)}?\n\nTheir folders, "
                "with their checkpoints, adapters and logs, are removed from disk:"
            )
        where = "\n".join(str(d) for d in chosen)
        answer = QMessageBox.question(
            self,
            "Delete run",
            f"{question}\n{where}\n\nThis cannot be undone.",
            QMessageBox.Yes | QMessageBox.No,
            QMessageBox.No,
        )
        if answer != QMessageBox.Yes or self._refuse_training(chosen):  # a run may have started meanwhile
            return
        failed = []
        for run_dir in chosen:
            try:
                shutil.rmtree(run_dir)
            except OSError as e:
                failed.append(f"{run_dir}: {e.strerror or e}")
        self.refresh()
        if failed:
            QMessageBox.warning(
                self,
                "Delete run",
                "Some folders could not be removed (a file in one may be "
                "open in another program; close it and delete again):\n" + "\n".join(failed),
            )

    def _refuse_training(self, chosen: list[Path]) -> bool:
        """Say so and return True when one of `chosen` is the run in training."""
        training = [run_dir for run_dir in chosen if self.is_training(run_dir)]
        if training:
            where = (
                "in another process: stop it there (Ctrl-C in its terminal)"
                if self.training_elsewhere(training[0])
                else "now. Stop it on the Monitor page"
            )
            QMessageBox.warning(
                self, "Delete run", f"“{training[0].name}” is training {where} first; then it can be deleted."
            )
        return bool(training)

    def _offer_best(self, run_dir: str | None) -> None:
        """Export best… is there for one run whose checkpoints have stored scores (scores.json and the checkpoints'
        manifests: small files); its tooltip names the checkpoint, or why there is none."""
        from hone.core.api import DEFAULT_METRIC, best_stored
        from hone.core.errors import HoneError

        if run_dir is None:
            self.best_button.setEnabled(False)
            self.best_button.setToolTip("Select one run to export its best checkpoint.")
            return
        try:
            best = best_stored(run_dir, DEFAULT_METRIC)
        except HoneError as e:
            self.best_button.setEnabled(False)
            self.best_button.setToolTip(
                f"{e.message[:1].upper()}{e.message[1:]}. {e.advice[:1].upper()}{e.advice[1:]}."
            )
            return
        self.best_button.setEnabled(True)
        self.best_button.setToolTip(
            f"Export the checkpoint with the lowest held-out loss: step {best.checkpoint} "
            f"(loss {best.metrics[DEFAULT_METRIC]:.4f}). The Export page lets you pick by another score."
        )

    def export_best_selected(self) -> None:
        chosen = self.selected_dirs()
        if len(chosen) == 1:
            from hone.core.api import DEFAULT_METRIC

            self.export_best_requested.emit(str(chosen[0]), DEFAULT_METRIC)

    def _open_folder(self) -> None:
        chosen = self.selected_dirs()
        if chosen:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(chosen[0])))

    def open_full_log(self) -> None:
        chosen = self.selected_dirs()
        if len(chosen) == 1:
            self.log_viewer = open_log_viewer(chosen[0], self)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Runs folder", str(self.runs_dir))
        if folder:
            self.state.update(f'output.runs_dir="{Path(folder).as_posix()}"')
            self.refresh()

    def shown(self) -> None:
        self.refresh()

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.comparison.apply_palette(palette)
        self.refresh_button.setIcon(icon("refresh", palette.text, 16))
        self.folder_button.setIcon(icon("folder", palette.text, 16))


def _row_texts(summary: Any, status: str, now: Progress | None) -> list[str]:
    started = getattr(summary, "started", None)
    loss = getattr(summary, "final_loss", None)  # the last recorded step's loss: final only once the run ended
    step, total = getattr(summary, "step", 0), getattr(summary, "total_steps", 0)
    if now is not None and now.step >= step:  # a run that trains now: its metrics are ahead of its run.json
        step, total, loss = now.step, now.total_steps or total, now.loss if now.loss is not None else loss
    loss_text = "—"
    if isinstance(loss, (int, float)):
        loss_text = f"{loss:.4f}" if status in ENDED else f"{loss:.4f} latest"
    return [
        Path(summary.run_dir).name,
        _short(getattr(summary, "model", "")),
        status_word(status),
        f"{step:,} / {total:,}" if total else f"{step:,}",
        loss_text,
        time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if isinstance(started, (int, float)) else "—",
    ]


def _sentence(text: str) -> str:
    """`text` as a sentence: a capital first letter and one full stop."""
    text = text.strip().rstrip(".")
    return f"{text[:1].upper()}{text[1:]}." if text else ""


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return Path(a) == Path(b)


def _short(name: str) -> str:
    return name.removeprefix("bundled:").replace("\\", "/").rsplit("/", 1)[-1]

"""The Studio's main window: a sidebar of pages, the shared state, the telemetry poller, and a safe close."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from hone.app.accessibility import KeyboardAccess
from hone.app.compat import install_guards
from hone.app.gui_gc import collect_on_gui_thread
from hone.app.helper_process import HELPER
from hone.app.pages.base import Page
from hone.app.pages.chat import ChatPage
from hone.app.pages.data import DataPage
from hone.app.pages.export import ExportPage
from hone.app.pages.model import ModelPage
from hone.app.pages.monitor import MonitorPage
from hone.app.pages.monitor_failures import explain
from hone.app.pages.monitor_next import EVALUATE, EXPORT, run_with_adapter
from hone.app.pages.runs import RunsPage
from hone.app.pages.train import TrainPage
from hone.app.settings import Settings
from hone.app.state import AppState
from hone.app.theme import DARK, LIGHT, SYSTEM, Palette, Theme, icon, logo_pixmap
from hone.app.workers import Task, TelemetryPoller, TrainerFactory
from hone.core.api import MachineFacts, read_machine
from hone.core.events import Event, RunFailed, RunFinished, RunPaused, RunResumed, RunStarted, StepMetrics
from hone.core.version import __version__

PAGE_CLASSES: tuple[type[Page], ...] = (ModelPage, DataPage, TrainPage, MonitorPage, ChatPage, ExportPage, RunsPage)
PAGE_NAMES = tuple(cls.name for cls in PAGE_CLASSES)


class ElidedLabel(QLabel):
    """One line of text that ends in "…" where the width cuts it (never mid-word without saying so); the whole text
    is its tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumWidth(1)  # the sidebar sets the width; the text adapts to it, not the other way round
        self.full_text = ""
        self.setText(text)

    def setText(self, text: str) -> None:  # Qt's name
        self.full_text = str(text)
        self.setToolTip(self.full_text)
        self._elide()

    def resizeEvent(self, event) -> None:  # Qt's name
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = self.contentsRect().width()
        shown = self.fontMetrics().elidedText(self.full_text, Qt.ElideRight, width) if width > 1 else self.full_text
        super().setText(shown)


class RunBadge(QFrame):
    """The sidebar's small summary of the current run, visible from every page: the same state the Monitor's pill
    shows (training, paused, finished, stopped, failed, interrupted, or training in another process)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("RunBadge")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.setSpacing(5)
        self.title = ElidedLabel("No run")
        self.title.setObjectName("RunBadgeTitle")
        self.detail = ElidedLabel("Start one on the Train page")
        self.detail.setProperty("role", "muted")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setMaximumHeight(6)
        self.bar.hide()
        for widget in (self.title, self.detail, self.bar):
            layout.addWidget(widget)

    def event_arrived(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.title.setText("Training")
            self.detail.setText("Starting…")
            self.bar.show()
            self.bar.setValue(0)
        elif isinstance(event, StepMetrics) and event.total_steps:
            self.bar.setValue(int(1000 * event.step / event.total_steps))
            self.detail.setText(f"Step {event.step:,}/{event.total_steps:,} · loss {event.loss:.3f}")
        elif isinstance(event, RunPaused):
            self.title.setText("Paused")
        elif isinstance(event, RunResumed):
            self.title.setText("Training")
        elif isinstance(event, RunFinished):
            self.title.setText("Stopped" if event.stopped else "Finished")
            self.detail.setText(f"Step {event.step:,} · loss {event.final_loss:.3f}")
            self.bar.hide()
        elif isinstance(event, RunFailed):
            self.title.setText("Interrupted" if event.interrupted else "Failed")
            self.detail.setText(explain(event)[0])
            self.bar.hide()

    def show_past_run(
        self, name: str, ended: Event | None, last_step: StepMetrics | None, status: str = "", following: bool = False
    ) -> None:
        """A past run opened from Runs: say which, and how it ended, or that another process trains it now."""
        self.bar.hide()
        step = f" · step {last_step.step:,}" if last_step else ""
        if isinstance(ended, RunFinished):
            self.title.setText("Stopped" if ended.stopped else "Finished")
            self.detail.setText(f"{name} · step {ended.step:,} · loss {ended.final_loss:.3f}")
        elif isinstance(ended, RunFailed):
            self.title.setText("Interrupted" if ended.interrupted else "Failed")
            self.detail.setText(f"{name} · {explain(ended)[0]}")
        elif following and status in ("running", "paused"):
            self.title.setText("Paused" if status == "paused" else "Training elsewhere")
            self.detail.setText(f"{name}{step} · in another process")
        else:
            self.title.setText("Interrupted")
            self.detail.setText(f"{name}{step} · its process ended before the run did: resume it from Runs")

    def running_changed(self, running: bool) -> None:
        if running:
            self.title.setText("Starting")
            self.detail.setText("Loading the model and data…")


class MainWindow(QMainWindow):
    """Hone Studio.

    Args:
        settings: where choices persist (tests pass one backed by a temporary file).
        trainer: what runs a training (the core Trainer; tests may pass another event source).
        theme: the application's Theme (created if None).
        telemetry: sample the GPU on a background thread (off for screenshots of non-monitor pages).
        machine: what this computer can run (tests pass one); None reads it on a background thread.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        trainer: TrainerFactory | None = None,
        theme: Theme | None = None,
        telemetry: bool = True,
        machine: MachineFacts | None = None,
    ):
        super().__init__()
        install_guards(QApplication.instance())
        self.settings = settings or Settings()
        self.theme = theme or Theme.shared(self.settings.theme())
        self.state = AppState(self.settings, trainer, self)
        self.setAttribute(Qt.WA_DeleteOnClose)  # closing frees every page, chart and timer at once
        # garbage is collected on this thread while the window lives (hone.app.gui_gc says why)
        self.release_gc = collect_on_gui_thread()
        release = self.release_gc
        self.destroyed.connect(lambda *_: release())
        self.setWindowTitle("Hone Studio")
        self.setWindowIcon(logo_pixmap(64))
        self.setMinimumSize(QSize(980, 640))

        central = QWidget()
        layout = QHBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self._sidebar())
        self.stack = QStackedWidget()
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.pages: dict[str, Page] = {}
        for cls in PAGE_CLASSES:
            page = cls(self.state)
            self.pages[cls.name] = page
            self.stack.addWidget(page)
            item = QListWidgetItem(cls.title)
            item.setData(Qt.UserRole, cls.name)
            item.setSizeHint(QSize(0, 40))
            self.nav.addItem(item)
        self.nav.currentRowChanged.connect(self._nav_changed)
        self.state.page_requested.connect(self.show_page)
        self.pages["runs"].open_requested.connect(self.open_run)
        self.pages["runs"].export_best_requested.connect(self._export_best)
        self.state.session.event.connect(self.badge.event_arrived)
        self.state.session.running_changed.connect(self.badge.running_changed)
        self.state.session.running_changed.connect(self._running_changed)

        self.telemetry = TelemetryPoller(self)
        self.telemetry.sample.connect(self.monitor.telemetry)
        self.monitor.run_shown.connect(self._past_run_shown)
        # a followed run pauses, stops or ends after it was shown: the badge says what the Monitor says
        self.monitor.status_changed.connect(lambda _status: self._follow_changed())
        # a run ends with an adapter: Chat and Export choose it, and the Monitor's next steps open them on it
        self.monitor.status_changed.connect(lambda _status: self._offer_ended_run())
        self.monitor.next_steps.asked.connect(self._run_next_step)
        if telemetry:
            self.telemetry.start()

        self.theme.changed.connect(self._apply_palette)
        self._apply_palette(self.theme.palette)
        geometry = self.settings.geometry()
        if geometry is None or not self.restoreGeometry(geometry):
            self.resize(1320, 860)
        self.show_page(self.settings.page() or "model")
        self._closing = False
        self.keyboard = KeyboardAccess(self)  # Ctrl+1…N, Ctrl+Q, accessible names, Tab in screen order
        if machine is not None:
            self.state.set_machine(machine)
        else:
            state = self.state
            Task(read_machine, on_result=lambda found: state.set_machine(found) if isValid(state) else None)

    # ---- pages ----
    @property
    def monitor(self) -> MonitorPage:
        return self.pages["monitor"]

    def page(self, name: str) -> Page:
        return self.pages[name]

    def show_page(self, name: str) -> None:
        if name not in self.pages:
            raise KeyError(f"no page {name!r}; pages are {', '.join(PAGE_NAMES)}")
        self.nav.setCurrentRow(PAGE_NAMES.index(name))

    def open_run(self, run_dir: str) -> None:
        """Show a past run in the Monitor (and make it the run Chat and Export offer)."""
        self.monitor.show_run(run_dir)  # the badge follows once the run is read (_past_run_shown)
        self.pages["chat"].select_run(run_dir)
        self.pages["export"].set_run(run_dir)
        self.show_page("monitor")

    def _past_run_shown(self, run_dir: str) -> None:
        if not self.state.session.is_running:  # the badge follows a live run first
            monitor = self.monitor
            following = monitor.following is not None
            self.badge.show_past_run(Path(run_dir).name, monitor.ended, monitor.last_step, monitor.status, following)

    def _follow_changed(self) -> None:
        monitor = self.monitor
        if not monitor.live and monitor.shown_dir is None and monitor.started is not None:
            self._past_run_shown(monitor.started.run_dir)

    def _offer_ended_run(self) -> None:
        """The Monitor's run ended with an adapter: Chat and Export choose it (each keeps its own choice while busy)."""
        run_dir = run_with_adapter(self.monitor.ended)
        if run_dir:
            self.pages["chat"].offer_run(run_dir)
            self.pages["export"].offer_run(run_dir)

    def _run_next_step(self, action: str, run_dir: str) -> None:
        """The Monitor's "Chat with it", "Evaluate" or "Export": that page, with the run chosen (loaded for Chat)."""
        if action == EXPORT:
            self.pages["export"].offer_run(run_dir)
            self.show_page("export")
        else:
            self.pages["chat"].open_run(run_dir, evaluate=action == EVALUATE)
            self.show_page("chat")

    def _export_best(self, run_dir: str, by: str) -> None:
        """The Runs page's Export best…: the Export page, on that run's best checkpoint by `by`."""
        export = self.pages["export"]
        export.offer_run(run_dir)
        export.select_weights(best_by=by)
        self.show_page("export")

    def current_page(self) -> str:
        return PAGE_NAMES[self.stack.currentIndex()]

    def _nav_changed(self, row: int) -> None:
        self.stack.setCurrentIndex(row)
        page = self.stack.currentWidget()
        self.settings.set_page(page.name)
        page.shown()

    def _sidebar(self) -> QWidget:
        sidebar = QWidget()
        sidebar.setObjectName("Sidebar")
        sidebar.setFixedWidth(228)
        layout = QVBoxLayout(sidebar)
        layout.setContentsMargins(14, 18, 14, 14)
        layout.setSpacing(6)
        brand = QHBoxLayout()
        brand.setSpacing(10)
        logo = QLabel()
        logo.setPixmap(logo_pixmap(34))
        brand.addWidget(logo)
        names = QVBoxLayout()
        names.setSpacing(0)
        app_name = QLabel("Hone Studio")
        app_name.setObjectName("AppName")
        tagline = QLabel(f"Fine-tuning · v{__version__}")
        tagline.setObjectName("AppTagline")
        names.addWidget(app_name)
        names.addWidget(tagline)
        brand.addLayout(names, 1)
        layout.addLayout(brand)
        layout.addSpacing(16)
        self.nav = QListWidget()
        self.nav.setObjectName("Nav")
        self.nav.setIconSize(QSize(18, 18))
        self.nav.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        layout.addWidget(self.nav, 1)
        self.badge = RunBadge()
        layout.addWidget(self.badge)
        self.theme_button = QPushButton()
        self.theme_button.setToolTip("Theme: follow the system, light, or dark")
        self.theme_button.clicked.connect(self._cycle_theme)
        layout.addWidget(self.theme_button)
        return sidebar

    # ---- theme ----
    def _cycle_theme(self) -> None:
        order = (SYSTEM, LIGHT, DARK)
        mode = order[(order.index(self.theme.mode) + 1) % len(order)]
        self.settings.set_theme(mode)
        self.theme.set_mode(mode)

    def _apply_palette(self, palette: Palette) -> None:
        for row, cls in enumerate(PAGE_CLASSES):
            item = self.nav.item(row)
            if item is not None:
                item.setIcon(icon(cls.icon_name, palette.text, 18))
        self.theme_button.setIcon(icon("theme", palette.muted, 16))
        self.theme_button.setText(
            {SYSTEM: "Theme: system", LIGHT: "Theme: light", DARK: "Theme: dark"}[self.theme.mode]
        )
        for page in self.pages.values():
            page.apply_palette(palette)

    # ---- run state ----
    def _running_changed(self, running: bool) -> None:
        if not running and self._closing:
            QTimer.singleShot(0, self.close)

    def background_work(self) -> list[Task]:
        """Tasks still running (model inspection, data checks, exports)."""
        return Task.running()

    # ---- closing ----
    def closeEvent(self, event) -> None:
        session = self.state.session
        if session.is_running and session.outlives_window and not self._closing:
            choice = self.ask_keep_on_close()
            if choice == "keep":  # the run's own process goes on; the Runs page follows it again
                self._closing = True
                session.detach()
                self.statusBar().showMessage("The run goes on in its own process; closing…")
            # the window closes once the run's thread has ended (stopped and saved, or no longer followed)
            event.ignore()
            return
        elif session.is_running:
            if not self._closing and self.ask_stop_on_close() == QMessageBox.Yes:
                # stopping saves the adapter and a checkpoint; the window closes once the run's thread has ended
                self._closing = True
                self.monitor.stop()
                self.statusBar().showMessage("Saving the run before closing…")
            event.ignore()
            return
        self.settings.set_geometry(self.saveGeometry())
        self.settings.sync()
        self.telemetry.shutdown()
        for page in self.pages.values():
            shutdown = getattr(page, "shutdown", None)
            if shutdown:
                shutdown()
        HELPER.end_jobs()  # a job still running there (an export) ends with the window; its staging is cleaned later
        for task in Task.running():
            task.wait(10_000)
        super().closeEvent(event)
        self.release_gc()

    def ask_keep_on_close(self) -> str:
        """A run training in its own process: keep it training after the window closes ("keep"), stop it first
        ("stop": it saves, then the window closes) or stay ("cancel")."""
        box = QMessageBox(
            QMessageBox.Question,
            "A run is still training",
            "It trains in a process of its own and can go on after Hone Studio closes; open it from "
            "Runs to follow it again. Or stop it now: it saves its adapter and a checkpoint first.",
            QMessageBox.Cancel,
            self,
        )
        keep = box.addButton("Keep training", QMessageBox.AcceptRole)
        stop = box.addButton("Stop and close", QMessageBox.DestructiveRole)
        box.setDefaultButton(keep)
        box.exec()
        clicked = box.clickedButton()
        if clicked is stop:
            self._closing = True
            self.monitor.stop()
            self.statusBar().showMessage("Saving the run before closing…")
            return "stop"
        return "keep" if clicked is keep else "cancel"

    def ask_stop_on_close(self) -> QMessageBox.StandardButton:
        """Ask whether to stop and save the running training before closing (Yes) or keep training (Cancel)."""
        return QMessageBox.question(
            self,
            "A run is still training",
            "Stop the run and save its adapter and a checkpoint, then close?\n\n"
            "The run stops after its current step. Cancel keeps it training.",
            QMessageBox.Yes | QMessageBox.Cancel,
            QMessageBox.Yes,
        )

"""Build Hone Studio's window and run it, or render one page to a PNG (`--screenshot`).

`hone studio` and the `hone-studio` script parse their options in `hone.app.studio_command` and call `run` here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

# Longest a screenshot waits for background work (reading a model's config, checking data) before it renders.
SCREENSHOT_WAIT_S = 120.0
DEFAULT_SIZE = (1440, 900)


def run(args: argparse.Namespace) -> int:
    if args.screenshot and not os.environ.get("QT_QPA_PLATFORM"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"  # render without a display (docs, CI)
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from hone.app.settings import APPLICATION, ORGANIZATION, Settings
    from hone.app.theme import Theme
    from hone.app.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setStyle("Fusion")  # the same widget geometry on every platform; the stylesheet does the rest
    instance = None  # the one-Studio-per-user lock, held while the window is open
    if not args.screenshot:  # a screenshot opens no window a user works in: it may run beside an open Studio
        from hone.app.single_instance import claim_instance

        instance = claim_instance()
        if instance is None:  # another Studio is open and the user chose not to open a second one
            return 0
    scratch = None
    if args.screenshot:
        # a screenshot neither reads nor changes the user's saved state, so it is reproducible
        scratch = tempfile.TemporaryDirectory(prefix="hone-studio-")
        settings = Settings(QSettings(str(Path(scratch.name) / "settings.ini"), QSettings.IniFormat))
    else:
        settings = Settings()
    theme = Theme.shared(args.theme or settings.theme())
    if args.theme and theme.mode != args.theme:
        theme.set_mode(args.theme)
    window = MainWindow(settings, theme=theme, telemetry=not args.screenshot or args.page == "monitor")
    if args.size:
        window.resize(*args.size)
    elif args.screenshot:
        window.resize(*DEFAULT_SIZE)
    apply_choices(window, args)
    if args.page:
        window.show_page(args.page)
    if args.screenshot:
        try:
            path = screenshot(window, args.screenshot)
        finally:
            window.close()
            if scratch is not None:
                scratch.cleanup()
        print(f"saved {path}")
        return 0
    window.show()
    from hone.app.setup_check import start_setup_check
    from hone.app.workers import save_runs_at_session_end

    # logoff or shutdown: the run the Studio follows stops after its step and saves before the session ends
    app.commitDataRequest.connect(lambda manager: save_runs_at_session_end([window.state.session]))

    start_setup_check(window, settings)  # says what is wrong with PyTorch or the GPU, if anything, in plain words
    return app.exec()


def apply_choices(window, args: argparse.Namespace) -> None:
    """--model, --data and --run: make those choices as the user would on the pages (several runs: the first in the
    Monitor, all of them selected on Runs, which compares them)."""
    if args.model:
        window.page("model").choose(args.model)
    if args.data:
        window.page("data").set_files([str(Path(f).expanduser()) for f in args.data], check=True)
    if args.run:
        first = args.run[0]
        if args.screenshot:  # the scratch settings list the run's own folder on Runs, Chat and Export
            window.state.update(f'output.runs_dir="{Path(first).resolve().parent.as_posix()}"')
            for name in ("runs", "chat", "export"):
                window.page(name).shown()
        window.open_run(first)  # Monitor, the sidebar's badge, Chat and Export, as opening it from Runs does
        if len(args.run) > 1:
            runs = window.page("runs")
            runs.select_dirs([Path(folder) for folder in args.run])
            runs.compare_selected()


def screenshot(window, path: str | Path) -> Path:
    """Show the window, let background work finish, and save what it looks like as a PNG."""
    from PySide6.QtWidgets import QApplication

    from hone.app.workers import Task

    window.show()
    app = QApplication.instance()
    deadline = time.monotonic() + SCREENSHOT_WAIT_S
    while (Task.running() or window.page("train").is_busy()) and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    for _ in range(5):  # let queued results, layouts and the charts' next redraw land
        app.processEvents()
        window.monitor.flush()
        time.sleep(0.05)
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not window.grab().save(str(path), "PNG"):
        raise OSError(f"could not write {path}")
    return path

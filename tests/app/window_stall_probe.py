"""Drives the Studio through its heavy one-off jobs in a process of its own and says, as one JSON line, the longest the
GUI thread went without running a 10 ms heartbeat timer during each: reading a model, the Train page's memory
estimate, the Data page's check of the bundled demo data, and exports of a run (adapter, merged, GGUF q8_0). Also
whether torch was ever imported in the window's process.

    QT_QPA_PLATFORM=offscreen python tests/app/window_stall_probe.py RUN MODEL SETTINGS.ini OUT [--in-window]

--in-window runs the jobs on threads of the window's process instead of the helper process (how the Studio ran them
before), to compare.
"""

from __future__ import annotations

import itertools
import json
import sys
import time


def main(run_dir: str, model_dir: str, settings_path: str, out_dir: str, in_window: bool) -> None:
    if in_window:
        import hone.app.helper_process as helper_process

        helper_process.in_helper = lambda fn: fn  # the pages import it below: jobs run on the window's threads
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from hone.app.settings import Settings
    from hone.app.window import MainWindow
    from hone.app.workers import Task
    from hone.core.config import DEMO_TRAIN_DATA

    app = QApplication.instance() or QApplication([])
    settings = Settings(QSettings(settings_path, QSettings.IniFormat))
    window = MainWindow(settings, telemetry=False)
    window.resize(1280, 820)
    window.show()
    beats: list[float] = []
    heartbeat = QTimer()
    heartbeat.setInterval(10)
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    heartbeat.start()

    def settle(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.002)

    def phase(start, done, timeout_s: float = 300.0) -> dict:
        """The longest heartbeat gap (ms) and the wall time (s) from start() until done() holds."""
        settle(0.3)
        began = time.perf_counter()
        beats.append(began)
        start()
        while not done() and time.perf_counter() - began < timeout_s:
            app.processEvents()
            time.sleep(0.001)
        ended = time.perf_counter()
        during = [t for t in beats if began <= t <= ended] + [ended]
        return {
            "longest_gap_ms": round(1000 * max(b - a for a, b in itertools.pairwise(during)), 1),
            "seconds": round(ended - began, 2),
            "finished": bool(done()),
        }

    settle(0.5)
    found: dict = {}
    model_page, train_page, export_page = window.page("model"), window.page("train"), window.page("export")
    found["read model"] = phase(lambda: model_page.choose(model_dir), lambda: not model_page.is_busy())
    found["memory estimate"] = phase(
        lambda: train_page._estimate_timer.start(0),
        lambda: train_page.estimate_task is not None and not train_page.is_busy(),
    )
    found["model ok"] = window.state.model_info is not None
    data_page = window.page("data")
    found["data check"] = phase(
        lambda: data_page.set_files([DEMO_TRAIN_DATA], check=True),
        lambda: data_page.result is not None and not data_page.task.is_running(),
    )
    found["data ok"] = data_page.result is not None and data_page.result.report.rows_kept > 0
    export_page.set_run(run_dir)
    export_page.force_box.setChecked(True)
    for fmt, kind in (("adapter", ""), ("merged", "bf16"), ("gguf", "q8_0")):
        export_page.format_buttons[fmt].click()
        if kind:
            export_page.type_box.setCurrentIndex(export_page.type_box.findData(kind))
        export_page.out_edit.setText(f"{out_dir}/{fmt}")
        results: list = []
        export_page.exported.connect(results.append)
        name = f"export {export_page.selected_format()}"
        found[name] = phase(export_page.export_button.click, lambda got=results: bool(got))
        export_page.exported.disconnect(results.append)
        found[name]["passed"] = bool(results and getattr(results[0], "passed", False))
    deadline = time.perf_counter() + 30
    while Task.running() and time.perf_counter() < deadline:
        settle(0.02)
    found["torch_in_window"] = "torch" in sys.modules
    window.close()
    print(json.dumps(found))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--in-window"]
    main(*args, in_window="--in-window" in sys.argv)

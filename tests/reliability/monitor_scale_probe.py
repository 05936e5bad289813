"""Opens a run folder in the Studio's Monitor in a process of its own and says, as one JSON line, how long until all
of its metrics.jsonl was in the page, how much memory that took, and the longest the GUI thread went without
running a 10 ms heartbeat timer meanwhile.

    QT_QPA_PLATFORM=offscreen python tests/reliability/monitor_scale_probe.py RUN_DIR SETTINGS.ini

Memory is the growth of the process's peak resident size (`peak_rss_kib`) from just before the run
is opened: everything the replay holds at its peak, Python, numpy and Qt alike.
"""

from __future__ import annotations

import itertools
import json
import resource
import sys
import time


def peak_rss_kib() -> int:
    """This process's peak resident size in KiB: /proc's VmHWM, which starts afresh with the program, where there is
    one (ru_maxrss keeps the peak of the process that started this one, as pytest does, before it exec'd the probe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def main(run_dir: str, settings_path: str) -> None:
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from hone.app.settings import Settings
    from hone.app.window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(Settings(QSettings(settings_path, QSettings.IniFormat)), telemetry=False)
    window.resize(1280, 820)
    window.show()
    for _ in range(20):  # let the window settle: its first layout and paint are not the replay's
        app.processEvents()
        time.sleep(0.01)
    beats: list[float] = []
    heartbeat = QTimer()
    heartbeat.setInterval(10)
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    shown: list[float] = []
    window.monitor.run_shown.connect(lambda _: shown.append(time.perf_counter()))
    rss_before = peak_rss_kib()
    heartbeat.start()
    app.processEvents()
    began = time.perf_counter()
    beats.append(began)
    window.open_run(run_dir)
    while not shown and time.perf_counter() - began < 120:
        app.processEvents()
        time.sleep(0.001)
    ended = shown[0] if shown else time.perf_counter()
    rss_after = peak_rss_kib()
    during = [t for t in beats if t <= ended] + [ended]
    monitor = window.monitor
    drawn_x, drawn_y = monitor.loss_chart.series["raw"].curve.getData()
    print(
        json.dumps(
            {
                "seconds": ended - began,
                "shown": bool(shown),
                "rss_growth_mb": (rss_after - rss_before) / 1024,
                "longest_gap_ms": 1000 * max(b - a for a, b in itertools.pairwise(during)),
                "longest_gap_at_s": max(itertools.pairwise(during), key=lambda ab: ab[1] - ab[0])[0] - began,
                "points": int(monitor.loss_chart.series["raw"].buffer.n),
                "drawn": len(drawn_y),
                "drawn_max": float(max(drawn_y)),
                "drawn_last": [float(drawn_x[-1]), float(drawn_y[-1])],
                "last_step": monitor.last_step.step if monitor.last_step else None,
                "status": monitor.status,
                "badge": window.badge.title.text(),
            }
        )
    )
    heartbeat.stop()
    window.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""While a Studio window is open, Python's garbage collection runs on the GUI thread only: a collection on a worker
thread that freed Qt objects deadlocked against the GUI thread deleting others (the window froze for good, and the
test suite with it). Closing the last window gives automatic collection back."""

from __future__ import annotations

import gc
import threading
import weakref

from PySide6.QtCore import QObject

from tests.app.conftest import settle_tasks


class _Cycle:
    def __init__(self):
        self.me = self
        self.qt = QObject()  # Qt objects in the garbage, as a Task's leftovers hold


def test_garbage_made_on_a_worker_thread_is_collected_on_the_gui_thread(qtbot, make_window):
    assert gc.isenabled()
    window = make_window()
    assert not gc.isenabled(), "automatic collection, which runs on any thread, is off while the window is open"
    freed_on = []

    def worker():
        cycle = _Cycle()
        weakref.finalize(cycle, lambda: freed_on.append(threading.current_thread()))
        del cycle
        for _ in range(50_000):  # allocations well past every generation's threshold
            [object()]

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert freed_on == [], "the worker's allocations collected nothing"
    qtbot.waitUntil(lambda: bool(freed_on), timeout=10_000)
    assert freed_on == [threading.main_thread()]
    settle_tasks(qtbot)  # (a window closed with its start-up Tasks running waits for each)
    window.close()
    assert gc.isenabled()


def test_collection_comes_back_when_the_last_window_closes(qtbot, make_window):
    first, second = make_window(), make_window()
    settle_tasks(qtbot)
    first.close()
    assert not gc.isenabled(), "another window is still open"
    second.close()
    assert gc.isenabled()


def test_what_the_window_is_built_from_is_left_out_of_later_full_collections(qtbot, make_window, monkeypatch):
    """A full collection walks every tracked object: 60 ms on the window's own process once its pages are built (and
    350 ms beside torch in a test process), a pause of the GUI thread each time. What is alive once the window has
    shown (modules, classes, the pages' widgets) stays for the window's life, so it is frozen out of later walks;
    garbage made afterwards is still collected (the tests above). Once per process: here, as if no window had opened."""
    from hone.app import gui_gc

    monkeypatch.setattr(gui_gc, "_frozen", False)
    frozen_before = gc.get_freeze_count()
    window = make_window()
    qtbot.waitUntil(lambda: gc.get_freeze_count() > frozen_before, timeout=5_000)
    form = window.page("train").form
    assert not any(o is form for o in gc.get_objects()), "the window's widgets are still walked by full collections"
    made_after = _Cycle()
    assert any(o is made_after for o in gc.get_objects())
    settle_tasks(qtbot)
    window.close()

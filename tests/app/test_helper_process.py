"""The Studio's helper process: a job runs in another process at a lower priority, its progress arrives in order
and before its result, its failure comes back in words, a killed child fails its job (and the next job gets a fresh
one), something that cannot be sent fails at once, and a closing window ends a running job without waiting."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

pytest.importorskip("PySide6", reason="the Studio's tests need PySide6")

from hone.app.helper_process import HELPER, in_helper
from hone.app.workers import Task
from tests.app import helper_jobs

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")


def _run(qtbot, fn, *args, timeout=60_000):
    got: dict = {"progress": []}
    task = Task(
        in_helper(fn),
        *args,
        on_result=lambda value: got.setdefault("result", (value, list(got["progress"]))),
        on_error=lambda error: got.setdefault("error", error),
        on_progress=got["progress"].append,
    )
    qtbot.waitUntil(lambda: not task.is_running(), timeout=timeout)
    return got


def test_a_job_runs_in_another_process_below_the_window_with_its_progress_first(qtbot):
    got = _run(qtbot, helper_jobs.count_up, 50)
    value, progress_then = got["result"]
    assert value["pid"] != os.getpid() and value["n"] == 50
    if hasattr(os, "nice"):
        assert value["niceness"] > os.nice(0), "the helper runs at a lower priority than the window"
    assert progress_then == list(range(50)), "every report arrives, in order, before the result"


def test_a_failure_comes_back_in_words_with_its_advice(qtbot):
    error = _run(qtbot, helper_jobs.refuse, "model.safetensors")["error"]
    assert error.message == "model.safetensors cannot be read" and error.advice == "pick another"


def test_a_killed_helper_fails_its_job_and_the_next_job_gets_a_fresh_one(qtbot):
    error = _run(qtbot, helper_jobs.die)["error"]
    assert "helper process ended" in error.message and "memory" in error.message
    value, _ = _run(qtbot, helper_jobs.count_up, 1)["result"]
    assert value["n"] == 1


def test_what_cannot_be_sent_fails_at_once(qtbot):
    began = time.monotonic()
    error = _run(qtbot, helper_jobs.count_up, threading.Lock())["error"]
    assert "pickle" in error.message.lower() and time.monotonic() - began < 30


def test_a_closing_window_ends_a_running_job_without_waiting_for_it(qtbot):
    task = Task(in_helper(helper_jobs.sleep_then_return), 120.0, on_error=lambda error: None)
    qtbot.waitUntil(lambda: HELPER.is_started() and bool(HELPER._listeners), timeout=30_000)
    time.sleep(0.5)  # the child has the job
    began = time.monotonic()
    HELPER.end_jobs()
    qtbot.waitUntil(lambda: not task.is_running(), timeout=30_000)
    assert time.monotonic() - began < 10 and task.error is not None and task.value is None


def test_a_changed_environment_gets_a_child_that_sees_it(qtbot, monkeypatch):
    monkeypatch.delenv("HONE_HELPER_MARK", raising=False)
    assert _run(qtbot, helper_jobs.environment, "HONE_HELPER_MARK")["result"][0] is None
    monkeypatch.setenv("HONE_HELPER_MARK", "hub settings changed")
    assert _run(qtbot, helper_jobs.environment, "HONE_HELPER_MARK")["result"][0] == "hub settings changed"

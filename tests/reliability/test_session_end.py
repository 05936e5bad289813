"""The desktop session ends (logoff, shutdown: QGuiApplication.commitDataRequest, which Hone Studio's window
answers with `save_runs_at_session_end`): the run the Studio follows is asked to stop as the Stop button does, and
the Studio waits for it to save. A QSessionManager cannot be built in a test, so the test calls the slot, on a real
run of the tiny model training in a child process (`hone train`), as the Studio starts it on Linux."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("PySide6", reason="the Studio's tests need PySide6")

from hone.core import events
from hone.core.train.checkpoints import complete_checkpoints
from tests.core.conftest import make_tiny_config, write_rows


@pytest.mark.slow  # one `hone train` child, ~12 s
@pytest.mark.skipif(os.name != "posix", reason="the Studio trains in a child process on Linux")
def test_the_end_of_the_desktop_session_stops_and_saves_the_run_the_studio_follows(qtbot, tiny_model_dir, tmp_path):
    from hone.app.workers import TrainSession, save_runs_at_session_end
    from hone.core.demo.text_data import make_dataset

    rows, _ = make_dataset(n_train=24, n_eval=4, seed=3)
    train = write_rows(tmp_path / "train.jsonl", rows)
    settings = ["train.max_steps=5000", "data.max_length=128", "train.batch_tokens=128", "data.eval=[]"]
    config = make_tiny_config(tiny_model_dir("tiny-dense"), (train, train), tmp_path / "runs", *settings)
    session, seen = TrainSession(), []
    session.event.connect(seen.append)
    session.start(config)
    assert session.in_child
    qtbot.waitUntil(lambda: any(isinstance(e, events.StepMetrics) for e in seen), timeout=120_000)
    run_dir = next(e.run_dir for e in seen if isinstance(e, events.RunStarted))

    started = time.monotonic()
    assert save_runs_at_session_end([session, TrainSession()], wait_s=60.0)  # a session with no run is passed over
    took = time.monotonic() - started
    summary = json.loads((tmp_path / "runs" / os.path.basename(run_dir) / "run.json").read_text())
    assert summary["status"] == "stopped" and summary["step"] >= 1, summary
    assert complete_checkpoints(run_dir)[-1].name == f"step-{summary['step']:06d}"
    assert os.path.isfile(os.path.join(run_dir, "adapter", "adapter_model.safetensors"))
    assert took < 30.0, f"the save took {took:.1f} s"
    qtbot.waitUntil(lambda: any(isinstance(e, events.RunFinished) for e in seen), timeout=10_000)
    assert next(e for e in seen if isinstance(e, events.RunFinished)).stopped
    qtbot.waitUntil(lambda: not session.is_running, timeout=10_000)


def test_the_wait_for_the_session_end_is_bounded(qtbot):
    """A run that does not end in time does not hold the logoff for longer than the wait."""
    from hone.app.workers import TrainSession, save_runs_at_session_end
    from hone.core.config import RunConfig

    stopped = []

    def never_ends(config, control, resume):
        while not control.stop_requested:
            time.sleep(0.01)
        stopped.append(time.monotonic())
        time.sleep(1.5)  # saving takes longer than the session waits
        yield events.RunFinished(step=1, run_dir="", adapter_dir="", final_loss=0.0, elapsed=0.0, stopped=True)

    session = TrainSession(never_ends)
    session.start(RunConfig())
    started = time.monotonic()
    assert not save_runs_at_session_end([session], wait_s=0.3)
    assert stopped and 0.3 <= time.monotonic() - started < 1.2
    qtbot.waitUntil(lambda: not session.is_running, timeout=10_000)  # it ends later, saved

"""Resuming a run in the Studio after its training file changed: the Monitor asks how to go on (the CLI's
--data-changed) instead of pointing at a command-line flag, and the run goes on as chosen. Real core trainer, real
run folder, real widgets."""

from __future__ import annotations

import json
import shutil

import pytest
from PySide6.QtWidgets import QMessageBox

from hone.core import events
from hone.core.control import RunControl
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer
from tests.core.conftest import make_tiny_config, write_rows


@pytest.fixture
def chat_files(tmp_path):
    from hone.core.demo.text_data import make_dataset

    train, eval_rows = make_dataset(n_train=24, n_eval=4, seed=3)
    return write_rows(tmp_path / "rows.jsonl", train), write_rows(tmp_path / "eval.jsonl", eval_rows)


def _stopped_run(tiny_model_dir, chat_files, tmp_path):
    """A run of 4 steps stopped after its step-2 checkpoint, trained on a copy of the chat rows (the copy is what
    the test then edits)."""
    train = tmp_path / "train.jsonl"
    shutil.copy(chat_files[0], train)
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"),
        (train, chat_files[1]),
        tmp_path / "runs",
        "train.max_steps=4",
        "output.checkpoint_every=2",
        'output.name="edited"',
    )
    control = RunControl()
    for event in Trainer(config, control, device="cpu").run():
        if isinstance(event, events.CheckpointSaved):
            control.stop()
    return tmp_path / "runs" / "edited", train


def test_a_resume_on_changed_data_asks_how_to_go_on_and_goes_on_as_chosen(
    qtbot, make_window, tiny_model_dir, chat_files, tmp_path
):
    run_dir, train = _stopped_run(tiny_model_dir, chat_files, tmp_path)
    rows = train.read_text(encoding="utf-8").splitlines()
    train.write_text("\n".join(rows[:-2]) + "\n", encoding="utf-8")  # the user dropped two rows meanwhile
    window = make_window()
    monitor = window.monitor
    with qtbot.waitSignal(monitor.failure_shown, timeout=120_000) as shown:
        window.state.session.resume_run(run_dir)
    failed = shown.args[0]
    assert failed.code == "data-changed" and "the training data changed since checkpoint" in failed.reason
    dialog = monitor.failure_dialog
    assert dialog.isVisible() and dialog.windowTitle() == "The training data changed"
    labels = [button.text() for button in dialog.buttons()]
    assert {"Restart the epoch", "Go on where it stopped"} <= set(labels)
    assert "--data-changed" not in dialog.informativeText()  # no command-line flag for a Studio user

    finished = []
    window.state.session.event.connect(lambda e: finished.append(e) if isinstance(e, events.RunFinished) else None)
    next(b for b in dialog.buttons() if b.text() == "Restart the epoch").click()
    qtbot.waitUntil(lambda: bool(finished), timeout=120_000)
    assert finished[-1].step == 4 and not finished[-1].stopped
    notices = [e.message for e in read_events(run_dir) if isinstance(e, events.Notice)]
    assert any("epoch 1 starts over" in m for m in notices), notices
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_cancel_leaves_the_run_as_it_was(qtbot, make_window, tiny_model_dir, chat_files, tmp_path):
    run_dir, train = _stopped_run(tiny_model_dir, chat_files, tmp_path)
    train.write_text(
        train.read_text(encoding="utf-8") + train.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8"
    )
    window = make_window()
    with qtbot.waitSignal(window.monitor.failure_shown, timeout=120_000):
        window.state.session.resume_run(run_dir)
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=30_000)
    before = (run_dir / "checkpoints").stat().st_mtime_ns, sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    window.monitor.failure_dialog.button(QMessageBox.Cancel).click()
    qtbot.wait(200)
    assert not window.state.session.is_running
    assert (
        (run_dir / "checkpoints").stat().st_mtime_ns,
        sorted(p.name for p in (run_dir / "checkpoints").iterdir()),
    ) == before
    assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped"  # the refused resume wrote nothing

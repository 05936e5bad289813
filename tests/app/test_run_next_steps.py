"""When the followed run ends with an adapter, Chat and Export choose it (unless busy with another), and the Monitor
offers "Chat with it", "Evaluate" and "Export" on it; none of that while training or for a run without an adapter."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from hone.core import events
from hone.core.api import MachineFacts
from hone.core.events import RunFinished, RunStarted
from tests.app.test_min_size import clipped_buttons


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A real run folder (2 steps on a tiny model, with an evaluation file), outside the window's runs folder."""
    from hone.core.config import RunConfig
    from hone.core.demo.text_data import make_dataset
    from hone.core.train.trainer import Trainer
    from tests.core.conftest import write_rows

    root = tmp_path_factory.mktemp("next-steps")
    rows_train, rows_eval = make_dataset(n_train=24, n_eval=4, seed=3)
    train, eval_file = write_rows(root / "train.jsonl", rows_train), write_rows(root / "eval.jsonl", rows_eval)
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(str(root / 'runs'))}",
            "output.name=ended",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=2",
        ]
    )
    assert isinstance(list(Trainer(config, device="cpu").run())[-1], events.RunFinished)
    return root / "runs" / "ended"


def _replaying(run_dir: Path, release: threading.Event, adapter: bool = True):
    """A trainer for the window that announces `run_dir`, waits for `release`, then ends it (with its adapter)."""

    def trainer(config, control, resume=None):
        yield RunStarted(
            run_dir=str(run_dir),
            model="tiny",
            device="cpu",
            dtype="float32",
            params_total=1,
            params_trainable=1,
            total_steps=2,
            tokens_per_epoch=1,
        )
        release.wait(30)
        adapter_dir = str(run_dir / "adapter") if adapter else ""
        yield RunFinished(step=2, run_dir=str(run_dir), adapter_dir=adapter_dir, final_loss=1.0, elapsed=0.1)

    return trainer


def _train(qtbot, window, release: threading.Event) -> None:
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: window.state.session.is_running, timeout=10_000)
    assert not window.monitor.next_steps.isVisibleTo(window.monitor), "no next steps while training"
    release.set()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=10_000)


def test_a_run_that_ended_becomes_chats_and_exports_choice(qtbot, make_window, finished_run):
    release = threading.Event()
    window = make_window(trainer=_replaying(finished_run, release), machine=MachineFacts(gpu=""))
    chat, export = window.page("chat"), window.page("export")
    assert "model" in chat.run_box.currentData() and export.run_dir() == ""  # no run yet: the base, nothing
    _train(qtbot, window, release)
    assert chat.run_box.currentData() == {"run_dir": str(finished_run)}
    assert chat.run_box.currentText() == "ended" and "ended is ready: press Load models" in chat.status.text()
    assert export.run_dir() == str(finished_run) and not export.run_hint.isVisibleTo(export)
    buttons = window.monitor.next_steps
    assert buttons.isVisibleTo(window.monitor) and buttons.run_dir == str(finished_run)
    window.resize(980, 640)  # the buttons fit the window's minimum size
    window.show_page("monitor")
    QApplication.processEvents()
    assert clipped_buttons(window) == []


def test_busy_pages_keep_their_choice(qtbot, make_window, finished_run, tmp_path):
    """A reply being written or an export under way keeps its run: the ended run is not forced on them."""
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    release = threading.Event()
    window = make_window(trainer=_replaying(finished_run, release), machine=MachineFacts(gpu=""))
    chat, export = window.page("chat"), window.page("export")
    chat.loaded = True  # no weights: a reply is asked for and stays under way
    chat.prompt.setPlainText("hello")
    chat.send()
    assert chat.generating
    base_choice = chat.run_box.currentData()
    export.set_run(str(other))
    export.format_buttons["adapter"].click()
    export.force_box.setChecked(True)
    with qtbot.waitSignal(export.exported, timeout=120_000) as done:
        export.export()
        assert export.is_busy()
        _train(qtbot, window, release)
        assert chat.run_box.currentData() == base_choice
        assert export.run_dir() == str(other)
    assert done.args[0].passed, done.args[0]
    assert export.run_dir() == str(other)


def test_no_next_steps_for_a_run_without_an_adapter(qtbot, make_window, tmp_path):
    release = threading.Event()
    run_dir = tmp_path / "no-adapter"
    run_dir.mkdir()
    window = make_window(trainer=_replaying(run_dir, release, adapter=False), machine=MachineFacts(gpu=""))
    _train(qtbot, window, release)
    assert window.monitor.status == "finished"
    assert not window.monitor.next_steps.isVisibleTo(window.monitor)
    assert "model" in window.page("chat").run_box.currentData() and window.page("export").run_dir() == ""


def test_the_monitors_next_steps_open_chat_evaluate_and_export(qtbot, make_window, finished_run):
    release = threading.Event()
    window = make_window(trainer=_replaying(finished_run, release), machine=MachineFacts(gpu=""))
    _train(qtbot, window, release)
    window.show_page("monitor")
    buttons, chat = window.monitor.next_steps, window.page("chat")

    buttons.chat_button.click()
    assert window.current_page() == "chat"
    qtbot.waitUntil(lambda: chat.loaded, timeout=120_000)
    assert chat.has_adapter and chat.source == {"run_dir": str(finished_run)}
    assert chat.status.text().startswith("Ready: ended: base model and its adapter")

    window.show_page("monitor")
    with qtbot.waitSignal(chat.evaluation_finished, timeout=300_000):
        buttons.evaluate_button.click()  # loaded already: the evaluation starts at once, on the run's eval rows
        assert window.current_page() == "chat" and chat.generating
    assert chat.evaluation_dialog is not None and chat.evaluation_dialog.isVisible()
    assert "Base: exact" in chat.evaluation_dialog.summary.text()
    chat.evaluation_dialog.close()

    window.show_page("monitor")
    buttons.export_button.click()
    assert window.current_page() == "export" and window.page("export").run_dir() == str(finished_run)

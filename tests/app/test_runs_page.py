"""The Runs page: why a failed run failed, deleting a run (never the one training), and a running run's loss read as
the latest, not the final one. Run folders are written by core's RunWriter, as a real run writes them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from hone.core.config import RunConfig
from hone.core.events import RunFailed, RunFinished, RunStarted, StepMetrics

REASON = "the GPU ran out of memory at step 4 (7.6 GiB in use)"
ADVICE = "use fewer tokens per batch (Train > train.batch_tokens)"


def _started(run_dir: Path, total: int, t: float) -> RunStarted:
    return RunStarted(
        run_dir=str(run_dir),
        model="bundled:tiny",
        device="cpu",
        dtype="float32",
        params_total=10,
        params_trainable=1,
        total_steps=total,
        tokens_per_epoch=100,
        time=t,
    )


def _step(s: int, total: int, loss: float, t: float) -> StepMetrics:
    return StepMetrics(
        step=s,
        total_steps=total,
        epoch=s / total,
        loss=loss,
        lr=1e-4,
        grad_norm=1.0,
        tokens=10,
        trained_tokens=5,
        tokens_per_s=100.0,
        step_time=0.1,
        elapsed=0.1 * s,
        time=t + 0.1 * s,
    )


def _write(run_dir: Path, events) -> Path:
    from hone.core.train.run_dir import RunWriter

    writer = RunWriter(run_dir, RunConfig())
    for event in events:
        writer.write(event)
    writer.close()
    return run_dir


def _finished(run_dir: Path, losses: list[float], t: float) -> Path:
    total = len(losses)
    return _write(
        run_dir,
        [
            _started(run_dir, total, t),
            *[_step(s, total, loss, t) for s, loss in enumerate(losses, 1)],
            RunFinished(
                step=total, run_dir=str(run_dir), adapter_dir="", final_loss=losses[-1], elapsed=1.0, time=t + 5
            ),
        ],
    )


def _failed(run_dir: Path, t: float) -> Path:
    return _write(
        run_dir,
        [
            _started(run_dir, 10, t),
            *[_step(s, 10, 2.0 / s, t) for s in (1, 2, 3)],
            RunFailed(reason=REASON, advice=ADVICE, step=3, details="Traceback ...", time=t + 1),
        ],
    )


def _lock_note(run_dir: Path, pid: int) -> None:
    """run.lock as a process `pid` on this computer leaves it (the lock itself ends with that process)."""
    import json
    import socket

    (run_dir / "run.lock").write_text(
        json.dumps({"pid": pid, "host": socket.gethostname(), "since": time.time()}) + "\n"
    )


def _row(page, name: str) -> int:
    rows = [page.table.item(row, 0).text() for row in range(page.table.rowCount())]
    return rows.index(name)


@pytest.fixture
def page(window):
    window.show_page("runs")
    return window.page("runs")


def test_a_failed_run_says_why_it_failed_in_the_list_and_the_detail(page, tmp_path):
    runs = tmp_path / "runs"
    t = time.time()
    _finished(runs / "fine", [2.0, 1.0], t)
    _failed(runs / "broken", t + 10)
    page.refresh()
    row = _row(page, "broken")
    status = page.table.item(row, 2)
    assert status.text() == "Failed"
    # the advice is only in metrics.jsonl's RunFailed (run.json keeps the reason alone)
    assert status.toolTip() == f"{REASON}\nWhat to do: {ADVICE}"
    page.select([row])
    assert page.detail.isVisibleTo(page)
    assert page.detail.text() == (
        f"Failed at step 3: {REASON}.\nWhat to do: Use fewer tokens per batch (Train > train.batch_tokens)."
    )
    page.select([_row(page, "fine")])
    assert "Failed" not in page.detail.text()
    assert page.table.item(_row(page, "fine"), 2).toolTip() == ""


def test_a_running_run_shows_its_latest_loss_never_a_final_one(page, tmp_path):
    runs = tmp_path / "runs"
    t = time.time()
    _finished(runs / "done", [3.0, 2.5, 1.25], t)
    # 12 of 40 steps and no end yet: run.json was last written at step 10
    _write(
        runs / "going", [_started(runs / "going", 40, t + 10), *[_step(s, 40, 1.0 / s, t + 10) for s in range(1, 13)]]
    )
    _lock_note(runs / "going", os.getpid())  # its trainer is alive (here: this process)
    page.refresh()
    assert page.table.horizontalHeaderItem(4).text() == "Loss"
    going, done = _row(page, "going"), _row(page, "done")
    assert page.table.item(going, 2).text() == "Training"
    # its metrics are ahead of run.json: the list says where the run is now
    assert page.table.item(going, 3).text() == "12 / 40"
    assert page.table.item(going, 4).text() == f"{1 / 12:.4f} latest"
    assert page.table.item(done, 4).text() == "1.2500"
    page.select([going])
    assert page.detail.text() == f"Latest loss {1 / 12:.4f} at step 12 of 40; the run has not ended."
    page.select([done])
    assert page.detail.text() == "Final loss 1.2500 after 3 steps."


class _Answers:
    """Stands in for QMessageBox's static dialogs: records what was asked, answers `reply`."""

    def __init__(self, monkeypatch, reply=QMessageBox.No):
        self.questions: list[tuple] = []
        self.warnings: list[str] = []
        self.reply = reply
        monkeypatch.setattr(QMessageBox, "question", self._question)
        monkeypatch.setattr(QMessageBox, "warning", lambda _parent, _title, text, *a, **k: self.warnings.append(text))

    def _question(self, _parent, title, text, buttons=None, default=None):
        self.questions.append((title, text, buttons, default))
        return self.reply


def test_delete_asks_first_then_removes_the_folder(page, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    t = time.time()
    keep = _finished(runs / "keep", [2.0, 1.0], t)
    old = _failed(runs / "old", t + 10)
    page.refresh()
    page.select([_row(page, "old")])
    assert page.delete_button.isEnabled()
    answers = _Answers(monkeypatch, reply=QMessageBox.Yes)
    page.delete_button.click()
    assert len(answers.questions) == 1
    title, text, buttons, default = answers.questions[0]
    assert title == "Delete run"
    assert "“old”" in text and str(old) in text
    assert buttons == QMessageBox.Yes | QMessageBox.No and default == QMessageBox.No, "No unless the user says Yes"
    assert not old.exists(), "the run folder is gone from disk"
    assert keep.is_dir() and (keep / "metrics.jsonl").is_file(), "only the chosen run"
    assert [page.table.item(r, 0).text() for r in range(page.table.rowCount())] == ["keep"]


def test_cancelling_delete_keeps_the_run(page, tmp_path, monkeypatch):
    run = _finished(tmp_path / "runs" / "precious", [2.0, 1.0], time.time())
    page.refresh()
    page.select([0])
    answers = _Answers(monkeypatch, reply=QMessageBox.No)
    page.delete_button.click()
    assert len(answers.questions) == 1
    assert (run / "metrics.jsonl").is_file() and (run / "run.json").is_file()
    assert [page.table.item(r, 0).text() for r in range(page.table.rowCount())] == ["precious"]


def test_the_run_in_training_cannot_be_deleted(qtbot, make_window, tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "live"

    def training(config, control, resume=None):
        """Writes its folder as the core trainer does, and steps until it is asked to stop."""
        from hone.core.train.run_dir import RunWriter

        writer = RunWriter(run_dir, config)
        t = time.time()
        for event in [_started(run_dir, 1000, t)]:
            writer.write(event)
            yield event
        step = 0
        while not control.stop_requested and step < 1000:
            step += 1
            time.sleep(0.01)
            event = _step(step, 1000, 1.0, t)
            writer.write(event)
            yield event
        finished = RunFinished(
            step=step, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=1.0, stopped=True
        )
        writer.write(finished)
        writer.close()
        yield finished

    window = make_window(trainer=training)
    window.show_page("runs")
    page = window.page("runs")
    _finished(tmp_path / "runs" / "other", [1.0], time.time() - 100)
    started = []
    window.state.session.event.connect(lambda e: started.append(e) if isinstance(e, RunStarted) else None)
    window.state.session.start(window.state.config)
    qtbot.waitUntil(lambda: bool(started), timeout=10_000)
    page.refresh()
    page.select([_row(page, "live")])
    assert not page.delete_button.isEnabled()
    assert "training" in page.delete_button.toolTip()
    answers = _Answers(monkeypatch, reply=QMessageBox.Yes)
    page.delete_selected()  # even when asked directly (a shortcut, a stale button)
    assert answers.questions == [], "no Yes can delete it: the question is never asked"
    assert len(answers.warnings) == 1 and "training" in answers.warnings[0]
    assert (run_dir / "metrics.jsonl").is_file()
    page.select([_row(page, "other")])
    assert page.delete_button.isEnabled(), "other runs can go while one trains"
    window.state.session.stop()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=10_000)
    page.select([_row(page, "live")])
    assert page.delete_button.isEnabled(), "once stopped it is a run like the others"


def test_compare_names_the_curves_after_their_runs_above_the_plot(qtbot, page, tmp_path):
    runs = tmp_path / "runs"
    t = time.time()
    _finished(runs / "alpha", [3.0, 2.0], t)
    _finished(runs / "beta", [2.5, 1.5, 1.0], t + 10)
    page.refresh()
    page.select([0, 1])
    page.compare_selected()
    view = page.comparison
    qtbot.waitUntil(lambda: view.comparison is not None and not view.reading, timeout=10_000)
    loss = view.charts["loss"]
    assert [name for name, _ in loss.legend_entries()] == ["beta", "alpha"]
    assert list(loss.points("run0")[1]) == [2.5, 1.5, 1.0] and list(loss.points("run1")[1]) == [3.0, 2.0]
    legend = loss.legend.mapTo(loss, loss.legend.rect().bottomLeft())
    assert legend.y() < loss.plot.mapTo(loss, loss.plot.rect().topLeft()).y()


def test_a_run_whose_process_was_killed_shows_as_interrupted_and_can_be_deleted(page, tmp_path):
    import subprocess
    import sys

    run_dir = tmp_path / "runs" / "cut"
    _write(run_dir, [_started(run_dir, 40, time.time()), *[_step(s, 40, 1.0 / s, time.time()) for s in range(1, 13)]])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _lock_note(run_dir, int(gone.stdout))  # the killed trainer's note: its process is gone
    page.refresh()
    row = _row(page, "cut")
    assert page.table.item(row, 2).text() == "Interrupted"
    page.select([row])
    assert page.detail.text() == (
        "Interrupted at step 10 of 40 (latest loss 0.1000): the process training it ended "
        "before the run did. Resume goes on from its newest checkpoint."
    )
    assert page.delete_button.isEnabled()


def test_a_run_training_in_another_process_cannot_be_deleted(page, tmp_path, monkeypatch):
    import subprocess
    import sys

    run_dir = tmp_path / "runs" / "elsewhere"
    _write(run_dir, [_started(run_dir, 40, time.time()), _step(1, 40, 1.0, time.time())])
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        _lock_note(run_dir, other.pid)  # `hone train` in a terminal, as its note says
        page.refresh()
        page.select([_row(page, "elsewhere")])
        assert page.table.item(_row(page, "elsewhere"), 2).text() == "Training elsewhere"
        assert not page.resume_button.isEnabled(), "its process still trains it"
        assert not page.delete_button.isEnabled()
        assert page.delete_button.toolTip() == (
            "This run is training in another process: stop it there before deleting it."
        )
        answers = _Answers(monkeypatch, reply=QMessageBox.Yes)
        page.delete_selected()
        assert answers.questions == [] and "in another process" in answers.warnings[0]
        assert run_dir.is_dir()
    finally:
        other.kill()
        other.wait()

"""The Studio over a runs folder of damaged runs (tests/reliability/damaged_runs.py) beside valid ones: the window
starts and every page shows, the Runs page lists the valid runs as they are and each damaged one as "damaged" with
the reason, and opening or resuming a damaged run says why in a dialog. Before, one damaged run.json stopped the
Studio from starting (a traceback from the Runs page), and a RunFailed whose reason was not text broke the page."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

pytest.importorskip("PySide6", reason="the Studio's tests need PySide6 (pip install pyside6-essentials)")

from PySide6.QtWidgets import QInputDialog, QMessageBox

from tests.app.conftest import make_window, settings  # noqa: F401  (the Studio's fixtures)
from tests.reliability import damaged_runs as corpus

ADAPTER_RUNS = ("valid-new", "json-not-utf8")  # runs given an adapter: the Export and Chat pages offer them


class _Dialogs:
    """Stands in for QMessageBox's static dialogs: records what each said, answers questions with `reply`."""

    def __init__(self, monkeypatch, reply=QMessageBox.No):
        self.said: list[tuple[str, str]] = []
        self.reply = reply
        for name in ("warning", "information", "critical"):
            monkeypatch.setattr(QMessageBox, name, self._record)
        monkeypatch.setattr(QMessageBox, "question", self._ask)
        monkeypatch.setattr(QInputDialog, "getInt", self._ask_number)  # "Train more steps" on a finished run

    def _record(self, _parent, title, text, *args, **kwargs):
        self.said.append((title, text))
        return QMessageBox.Ok

    def _ask(self, _parent, title, text, *args, **kwargs):
        self.said.append((title, text))
        return self.reply

    def _ask_number(self, _parent, title, text, value, *args, **kwargs):
        self.said.append((title, text))
        return value, self.reply == QMessageBox.Yes


@pytest.fixture
def folders(tmp_path):
    folders = corpus.write_corpus(tmp_path / "runs")
    for name in ADAPTER_RUNS:
        mtime = folders[name].stat().st_mtime
        (folders[name] / "adapter").mkdir()
        (folders[name] / "adapter" / "adapter_config.json").write_text("{}")
        os.utime(folders[name], (mtime, mtime))  # the folder's time orders a damaged run: as the corpus set it
    return folders


def _rows(page) -> dict[str, list[str]]:
    table = page.table
    return {
        table.item(r, 0).text(): [table.item(r, c).text() for c in range(table.columnCount())]
        for r in range(table.rowCount())
    }


def _row(page, name: str) -> int:
    return [page.table.item(r, 0).text() for r in range(page.table.rowCount())].index(name)


def test_the_studio_starts_over_damaged_runs_and_lists_each_with_why(qtbot, make_window, folders):  # noqa: F811
    from hone.app.window import PAGE_NAMES

    window = make_window()
    for name in PAGE_NAMES:
        window.show_page(name)
        qtbot.wait(5)
        assert window.current_page() == name
    page = window.page("runs")
    page.refresh()
    rows = _rows(page)
    damaged = [f"json-{case}" for case in reversed(corpus.RUN_JSON)]  # newest folder first
    assert list(rows) == [*damaged, "valid-new", "bad-failure", "bad-metrics", "valid-old"]
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(corpus.T0 + 1000))
    assert rows["valid-new"] == ["valid-new", "smollm2-135m-instruct", "Finished", "3 / 3", "1.0000", started]
    assert rows["bad-metrics"][2] == rows["bad-failure"][2] == "Failed"
    # its metrics.jsonl ends with RunFailed lines whose reason is a number or a list: the run's own is shown
    assert page.table.item(_row(page, "bad-failure"), 2).toolTip() == "the GPU ran out of memory\nWhat to do: lower it"
    page.select([_row(page, "bad-failure")])
    assert page.detail.text() == "Failed at step 2: the GPU ran out of memory.\nWhat to do: Lower it."
    # a 9 MB line after its RunFailed: the end of the file read for it holds none, and run.json's reason is shown
    assert page.table.item(_row(page, "bad-metrics"), 2).toolTip() == "the GPU ran out of memory"
    for case, (_, why) in corpus.RUN_JSON.items():
        name = f"json-{case}"
        assert rows[name][2] == "Damaged", name
        tip = page.table.item(_row(page, name), 2).toolTip()
        assert tip.startswith("run.json") and why in tip and f"hone train --resume {folders[name]}" in tip, tip
    page.select([_row(page, "json-started-yesterday")])
    assert page.detail.text() == (
        "Damaged: run.json: started is 'yesterday', not a time.\nWhat to do: The run's checkpoints and adapter are "
        f"untouched: `hone train --resume {folders['json-started-yesterday']}` still works if its config.toml and a "
        "checkpoint are intact (and writes run.json anew); or delete the folder."
    )
    export, chat = window.page("export"), window.page("chat")
    export.refresh_runs()
    chat.refresh_runs()
    assert sorted(export.run_box.itemText(i) for i in range(export.run_box.count())) == sorted(ADAPTER_RUNS)
    offered = [chat.run_box.itemText(i) for i in range(chat.run_box.count())]
    assert sorted(offered[:-1]) == sorted(ADAPTER_RUNS) and offered[-1].startswith("Base model only")


def test_opening_a_damaged_run_says_why_and_the_monitor_shows_what_can_be_read(make_window, folders, monkeypatch):  # noqa: F811
    window = make_window()
    page = window.page("runs")
    window.show_page("runs")
    dialogs = _Dialogs(monkeypatch)
    page.select([_row(page, "json-step-abc")])
    page.open_selected()
    assert dialogs.said == [
        (
            "Open run",
            "run.json: step is 'abc', not a whole number.\n\nThe Monitor shows what the run's metrics.jsonl holds."
            f"\n\nWhat to do: The run's checkpoints and adapter are untouched: `hone train --resume "
            f"{folders['json-step-abc']}` still works if its config.toml and a checkpoint are intact (and writes "
            "run.json anew); or delete the folder.",
        )
    ]
    assert window.current_page() == "monitor"
    assert list(window.monitor.loss_chart.points("raw")[1]) == [2.0, 1.5]
    window.show_page("runs")
    page.select([_row(page, "bad-metrics")])
    page.open_selected()  # 20 lines no Hone wrote, two of them RunFailed with a reason that is no text
    assert len(dialogs.said) == 1, "a valid run.json: opened without a word"
    assert window.current_page() == "monitor"
    assert list(window.monitor.loss_chart.points("raw")[1]) == [2.0, 1.5]


def test_resuming_a_damaged_run_asks_first_and_a_damaged_config_says_which_file(make_window, folders, monkeypatch):  # noqa: F811
    window = make_window()
    page = window.page("runs")
    dialogs = _Dialogs(monkeypatch, reply=QMessageBox.No)
    page.select([_row(page, "json-model-5")])
    page.resume_selected()
    assert [title for title, _ in dialogs.said] == ["Resume run"]
    assert dialogs.said[0][1].startswith("run.json: model is 5, not text.\n\nA resume reads the run's config.toml")
    assert not window.state.session.is_running, "No: nothing starts"
    config = folders["valid-old"] / "config.toml"
    config.write_bytes(b'[model]\nname_or_path = "\xff"\n')
    page.select([_row(page, "valid-old")])
    page.resume_selected()  # a finished run: how many steps more, then its config.toml is read
    assert [title for title, _ in dialogs.said[1:]] == ["Train more steps"], dialogs.said
    assert not window.state.session.is_running, "cancelled: nothing starts"
    dialogs.reply = QMessageBox.Yes
    page.resume_selected()
    assert [title for title, _ in dialogs.said[2:]] == ["Train more steps", "Train more steps"], dialogs.said
    assert dialogs.said[3][1].startswith(f"{config} is not UTF-8 text: byte 0xff at offset 24 (line 2)")
    assert not window.state.session.is_running and window.current_page() != "monitor"


@pytest.mark.skipif(os.name != "posix", reason="the Studio's run in a process of its own, as on Linux")
def test_resuming_a_run_whose_checkpoint_state_is_damaged_shows_which_file(qtbot, make_window, folders, monkeypatch):  # noqa: F811
    """Yes to the question: the run resumes in its own process (`hone train --resume`), which stops on the crafted
    state.json before a model loads, and the Monitor shows why."""
    run_dir = folders["json-not-utf8"]
    step = run_dir / "checkpoints" / "step-000002"
    step.mkdir(parents=True)
    files = {}
    for name, data in (("trainable.safetensors", b"w"), ("training_state.pt", b"t"), ("state.json", b"[2]")):
        (step / name).write_bytes(data)
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step / "manifest.json").write_text(json.dumps({"hone_checkpoint": 2, "files": files}))
    window = make_window()
    page = window.page("runs")
    dialogs = _Dialogs(monkeypatch, reply=QMessageBox.Yes)
    page.select([_row(page, "json-not-utf8")])
    failures = []
    window.monitor.failure_shown.connect(failures.append)
    page.resume_selected()
    assert window.current_page() == "monitor" and dialogs.said[0][1].startswith("run.json is not UTF-8 text")
    qtbot.waitUntil(lambda: bool(failures) and not window.state.session.is_running, timeout=60_000)
    expected = f"{step / 'state.json'} holds a JSON array, not an object"
    assert failures[0].reason == expected
    assert window.monitor.failure_dialog.text() == expected

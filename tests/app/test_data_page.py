"""Data page: the validation report accounts for every row (training and evaluation), a skipped row opens in the
inspector as the file holds it, the preview and the inspector show what is trained, and the histogram holds every
kept row and is in view without scrolling."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest

pytest.importorskip("hone.core.data.inspect", reason="the dataset inspector has not landed in this checkout")


def _write_rows(path):
    good = [
        {"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w}!"}]}
        for w in ("alpha", "beta", "gamma")
    ]
    lines = [json.dumps(r) for r in good]
    lines.insert(1, '{"messages": [{"role": "user", "content": "cut off')  # broken JSON
    lines.append(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}))  # nothing to train
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return good


def test_check_reports_every_row_and_the_inspector_highlights_the_answer(qtbot, window, tiny_model_dir, tmp_path):
    window.state.update(f'model.name_or_path="{tiny_model_dir("tiny-dense").as_posix()}"')
    data_file = tmp_path / "rows.jsonl"
    good = _write_rows(data_file)
    page = window.page("data")
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        page.set_files([str(data_file)], check=True)
    result = blocker.args[0]
    report = result.report
    assert (report.rows_read, report.rows_kept, sum(report.skipped.values())) == (5, 3, 2)
    assert page.kept_tile.value() == "3" and page.skipped_tile.value() == "2"
    assert page.skipped_table.rowCount() == len(report.skipped)
    reasons = {page.skipped_table.item(r, 0).text() for r in range(page.skipped_table.rowCount())}
    assert reasons == set(report.skipped)
    listed = [page.skipped_rows_table.item(r, 0).text() for r in range(page.skipped_rows_table.rowCount())]
    assert listed == ["rows.jsonl:2", "rows.jsonl:5"], "every skipped row is listed by file:row"

    # histogram: one bar area per kept row
    heights = page.histogram_bars.opts["height"]
    assert int(np.sum(heights)) == 3 == result.lengths.size

    # preview: the kept rows, in order, with their prompt and answer
    assert page.preview_table.rowCount() == 3
    assert [page.preview_table.item(r, 0).text() for r in range(3)] == ["1", "3", "4"]
    assert page.preview_table.item(0, 1).text() == "Say alpha" and page.preview_table.item(0, 2).text() == "alpha!"

    # inspector: the answer is inside the highlighted (trained) text, the prompt is not
    page.preview_table.selectRow(2)
    trained = [p.text for p in result.preview[2].pieces if p.trained]
    assert good[2]["messages"][1]["content"] in "".join(trained)
    assert "Say gamma" not in "".join(trained)
    shown = page.inspector.toHtml()
    assert html.escape("gamma!") in shown and "rows.jsonl:4" in page.inspector_title.text()


def test_format_override_and_files_persist_in_the_config(window, settings):
    page = window.page("data")
    page.set_files(["a.jsonl", "b.csv"], ["held.jsonl"])
    page.format_box.setCurrentIndex(page.format_box.findData("alpaca"))
    assert window.state.config.data.train == ["a.jsonl", "b.csv"]
    assert window.state.config.data.eval == ["held.jsonl"]
    assert settings.config().data.format == "alpaca"
    assert [page.train_list.item(i).text() for i in range(page.train_list.count())] == ["a.jsonl", "b.csv"]


def _check(qtbot, page, train, eval_files=None):
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        page.set_files(train, eval_files or [], check=True)
    return blocker.args[0]


def test_a_skipped_row_opens_in_the_inspector_as_the_file_holds_it(qtbot, window, tiny_model_dir, tmp_path):
    window.state.update(f'model.name_or_path="{tiny_model_dir("tiny-dense").as_posix()}"')
    data_file = tmp_path / "rows.jsonl"
    _write_rows(data_file)
    page = window.page("data")
    _check(qtbot, page, [str(data_file)])
    lines = data_file.read_text(encoding="utf-8").splitlines()
    with qtbot.waitSignal(page.inspected, timeout=30_000):
        page.skipped_rows_table.selectRow(0)  # rows.jsonl:2, the broken JSON line
    assert page.tabs.currentWidget() is page.inspector.parentWidget(), "the click opens the inspector"
    assert page.inspector.toPlainText() == lines[1], "the raw line, as the file holds it"
    title = page.inspector_title.text()
    assert title.count("rows.jsonl:2") == 1 and "not valid JSON" in title, title
    with qtbot.waitSignal(page.inspected, timeout=30_000):
        page.skipped_rows_table.selectRow(1)  # rows.jsonl:5, a user turn without an answer
    assert json.loads(page.inspector.toPlainText()) == json.loads(lines[4])
    assert page.inspector_title.text().count("rows.jsonl:5") == 1


def test_every_skip_reason_is_in_view_and_eval_data_is_checked_too(qtbot, window, tiny_model_dir, tmp_path):
    from PySide6.QtWidgets import QApplication

    window.state.update(f'model.name_or_path="{tiny_model_dir("tiny-dense").as_posix()}"')
    rows = [
        b'{"messages": [{"role": "user", "content": "cut off',
        b"[1, 2]",
        b'{"a": 1}',
        json.dumps({"messages": [{"role": "user", "content": "no answer"}]}).encode(),
        b'{"messages": "\xff"}',
        json.dumps({"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}),
        json.dumps({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "y"}]}),
    ]
    train = tmp_path / "train.jsonl"
    train.write_bytes(b"\n".join(r if isinstance(r, bytes) else r.encode() for r in rows) + b"\n")
    held = tmp_path / "held.jsonl"
    _write_rows(held)
    page = window.page("data")
    result = _check(qtbot, page, [str(train)], [str(held)])
    assert len(result.report.skipped) == 7 and result.eval_report is not None
    assert (result.eval_report.rows_read, result.eval_report.rows_kept) == (5, 3)
    window.show_page("data")
    page.tabs.setCurrentIndex(0)
    QApplication.processEvents()
    table = page.skipped_table
    assert table.rowCount() == 7 + len(result.eval_report.skipped)
    viewport = table.viewport().height()
    assert sum(table.rowHeight(r) for r in range(table.rowCount())) <= viewport, "no reason is cut off"
    listed = [page.skipped_rows_table.item(r, 0).text() for r in range(page.skipped_rows_table.rowCount())]
    assert "held.jsonl:2 (evaluation)" in listed and "held.jsonl:5 (evaluation)" in listed
    assert "Evaluation data" in page.report_text.toPlainText()
    assert "5 evaluation rows" in page.status.text()


def test_a_missing_file_says_so(qtbot, window, tiny_model_dir, tmp_path):
    window.state.update(f'model.name_or_path="{tiny_model_dir("tiny-dense").as_posix()}"')
    page = window.page("data")
    missing = tmp_path / "nowhere.jsonl"
    _check(qtbot, page, [str(missing)])
    assert "nowhere.jsonl does not exist" in page.status.text() and page.status.property("role") == "error"


def test_the_histogram_is_in_view_without_scrolling(qtbot, make_window, tmp_path):
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QApplication, QScrollArea

    window = make_window()
    window.resize(1366, 768)
    window.show_page("data")
    QApplication.processEvents()
    page = window.page("data")
    area = page.findChild(QScrollArea)
    assert area.verticalScrollBar().value() == 0
    top = page.histogram.mapTo(area.viewport(), QPoint(0, 0)).y()
    assert page.histogram.isVisible() and top >= 0 and top + page.histogram.height() // 2 <= area.viewport().height()

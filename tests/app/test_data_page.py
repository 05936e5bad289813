"""Data page: the validation report accounts for every row, the preview and the inspector show what is trained,
and the histogram holds every kept row."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest

pytest.importorskip("hone.core.data.inspect", reason="the dataset inspector has not landed in this checkout")


def _write_rows(path):
    good = [{"messages": [{"role": "user", "content": f"Say {w}"}, {"role": "assistant", "content": f"{w}!"}]}
            for w in ("alpha", "beta", "gamma")]
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
    assert "rows.jsonl:2" in page.report_text.toPlainText(), "the first skipped rows are listed by file:row"

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

"""The Data and Model pages say what went wrong in whole sentences, the token tiles say why they are empty (never
"needs a model" while one is chosen), and the length histogram without lengths says what to do instead of drawing
an empty axis."""

from __future__ import annotations

import json
import re

import numpy as np

from tests.app.conftest import settle_tasks


def _check(qtbot, page, train):
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        page.set_files(train, [], check=True)
    settle_tasks(qtbot)  # the check's thread has ended: the next check is not refused as one under way
    return blocker.args[0]


def _rows(path, count=3):
    rows = [
        {"messages": [{"role": "user", "content": f"Say {i}"}, {"role": "assistant", "content": f"{i}!"}]}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _sentences_ok(text: str, problem: str) -> None:
    """The core's `problem` is in `text`, not glued onto a prefix that wants an object ("Could not read x is
    empty"), and the text ends a sentence."""
    assert problem in text and f"read {problem}" not in text, text
    assert text.rstrip().endswith("."), text


def test_an_empty_file_is_said_in_a_whole_sentence(qtbot, window, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    page = window.page("data")
    result = _check(qtbot, page, [str(empty)])
    assert result.problems == [f"{empty} is empty (0 bytes)"]  # the core's message, as the report holds it
    _sentences_ok(page.status.text(), result.problems[0])
    assert page.status.property("role") == "error"


def test_an_entry_that_is_not_there_is_said_in_a_whole_sentence(qtbot, window, tmp_path):
    page = window.page("data")
    result = _check(qtbot, page, ["Not a model id!!", str(_rows(tmp_path / "rows.jsonl"))])
    assert result.problems[0].startswith("Not a model id!! does not exist")
    _sentences_ok(page.status.text(), result.problems[0])
    assert "Checked 3 training rows" in page.status.text()


def test_a_model_that_is_not_there_is_said_once_in_a_whole_sentence(qtbot, window):
    page = window.page("model")
    with qtbot.waitSignal(page.inspected, timeout=120_000):
        page.choose("Not a model id!!")
    text = page.status.text()
    first = text.splitlines()[0]
    assert first.count("Not a model id!!") == 1, text
    assert re.fullmatch(r"[A-Z“].*\.", first), first
    assert "Not a model id!! does not exist" in first


def test_token_tiles_say_why_they_are_empty(qtbot, window, tiny_model_dir, tmp_path):
    page = window.page("data")
    window.state.update('model.name_or_path=""')
    data = str(_rows(tmp_path / "rows.jsonl"))
    _check(qtbot, page, [data])
    assert page.tokens_tile.value() == "—" and "choose a model" in page.tokens_tile.detail().lower()

    # a model chosen after the check: the tiles no longer ask for one, the check runs again with its tokenizer
    with qtbot.waitSignal(page.checked, timeout=120_000) as blocker:
        window.state.update(f'model.name_or_path="{tiny_model_dir("tiny-dense").as_posix()}"')
    settle_tasks(qtbot)
    assert blocker.args[0].model is not None
    tokens = blocker.args[0].report.tokens
    assert tokens > 0 and page.tokens_tile.value() == f"{tokens:,}"
    assert "needs a model" not in page.tokens_tile.detail()

    # a model chosen, but every row skipped: the tiles say so, not that a model is missing
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": "nope"}\n', encoding="utf-8")
    _check(qtbot, page, [str(broken)])
    for tile in (page.tokens_tile, page.lengths_tile):
        assert tile.value() == "—" and tile.detail() == "no rows kept", tile.detail()


def test_the_histogram_without_lengths_says_what_to_do(qtbot, window, tmp_path):
    page = window.page("data")
    chart = page.lengths_chart
    bottom = chart.plot.getPlotItem().getAxis("bottom")

    def empty_state() -> bool:
        """The hint in view, no axis (it would span a meaningless 2047.6-2048.4 around the limit line), no line."""
        return chart.empty.isVisibleTo(chart) and not bottom.isVisible() and not chart.limit_line.isVisible()

    window.show_page("data")
    assert empty_state() and "Check data" in chart.empty.text()
    chart.draw(np.array([3, 5, 8]), 16, "#000000")
    assert not chart.empty.isVisibleTo(chart) and bottom.isVisible() and chart.limit_line.isVisible()
    assert int(chart.bars.opts["height"].sum()) == 3
    view = chart.plot.getPlotItem().getViewBox()
    qtbot.waitUntil(lambda: view.viewRange()[0][0] <= 3 and view.viewRange()[0][1] >= 8, timeout=5_000)  # the bars
    chart.draw(np.zeros(0, np.int64), 16, "#000000", why="Choose a model to count tokens, then press Check data.")
    assert empty_state() and chart.empty.text().startswith("Choose a model")

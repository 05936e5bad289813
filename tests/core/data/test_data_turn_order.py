"""Turn order, empty prompts, the user's own field names, and a file whose columns match no format: each row is
merged, skipped or kept by the rule the README's format table states, and every such row is reported."""

from __future__ import annotations

import json

import pytest
from data_helpers import write_jsonl

from hone.core.config import DataConfig
from hone.core.data import check_data
from hone.core.data.formats import suggest_columns
from hone.core.errors import ConfigError

GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def _turns(*pairs):
    return {"messages": [{"role": r, "content": c} for r, c in pairs]}


def _check(tmp_path, rows, name="a.jsonl", **cfg):
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        write_jsonl(path, rows)
    report, _ = check_data(DataConfig(train=[str(path)], **cfg))
    return report


def _rows_of(tmp_path, rows, **cfg):
    """The normalized Rows (through the same reader the pipeline uses), keyed by row number."""
    from hone.core.data.loaders import resolve_sources
    from hone.core.data.pipeline import iter_rows

    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    (source,) = resolve_sources([str(path)])
    return dict(iter_rows(source, DataConfig(train=[str(path)], **cfg)))


# (case, row, "merge" | "keep" | "skip", what the report must say about that row)
CASES = [
    ("two user turns", _turns(("user", "q1"), ("user", "q2"), ("assistant", "a")), "merge", "two user turns in a row"),
    (
        "two assistant turns",
        _turns(("user", "q"), ("assistant", "a1"), ("assistant", "a2")),
        "merge",
        "two assistant turns in a row",
    ),
    (
        "system mid-conversation",
        _turns(("user", "q"), ("assistant", "a"), ("system", "s"), ("user", "q2"), ("assistant", "a2")),
        "skip",
        "messages[2].role",
    ),
    ("assistant first, user last", _turns(("assistant", "a"), ("user", "q")), "skip", "messages[0].role"),
    (
        "assistant first, then answered",
        _turns(("assistant", "hi"), ("user", "q"), ("assistant", "a")),
        "keep",
        "starts with an assistant turn",
    ),
    ("user last", _turns(("user", "q"), ("assistant", "a"), ("user", "thanks")), "keep", "ends with a user turn"),
    ("empty user prompt", _turns(("user", "  "), ("assistant", "a")), "skip", "messages[0].content"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_turn_order_rule_is_applied_and_the_row_is_reported(tmp_path, case):
    _, row, action, words = case
    report = _check(tmp_path, [GOOD, row, GOOD])
    assert report.rows_read == 3
    if action == "skip":
        assert report.rows_kept == 2 and sum(report.skipped.values()) == 1
        (message,) = report.skipped_examples
        assert message.startswith(f"{tmp_path / 'a.jsonl'}:2: {words}"), message
    else:
        assert report.rows_kept == 3 and not report.skipped
        (note,) = [n for n in report.notes if words in n]
        assert note.startswith("1 row ") and f"{tmp_path / 'a.jsonl'}:2" in note and "kept" in note


def test_consecutive_turns_are_merged_with_a_blank_line(tmp_path):
    rows = _rows_of(
        tmp_path, [_turns(("system", "s"), ("user", "q1"), ("user", "q2"), ("assistant", "a1"), ("assistant", "a2"))]
    )
    assert rows[1].messages == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1\n\nq2"},
        {"role": "assistant", "content": "a1\n\na2"},
    ]


def test_assistant_turns_around_tool_calls_are_not_merged(tmp_path):
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    row = {
        "messages": [
            {"role": "user", "content": "q"},
            call,
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "it is 42"},
        ]
    }
    (kept,) = _rows_of(tmp_path, [row]).values()
    assert [m["role"] for m in kept.messages] == ["user", "assistant", "tool", "assistant"] and not kept.notes


def test_sharegpt_reversed_speakers_are_skipped_with_the_users_field_names(tmp_path):
    rows = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        {"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt"}]},
        {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "a"}]},
    ]
    report = _check(tmp_path, rows, name="s.json")
    assert report.rows_kept == 1
    messages = "\n".join(report.skipped_examples)
    assert ":2: conversations[0].from:" in messages and "swapped" in messages
    assert ":3: conversations[1].value: is missing" in messages
    assert ":4: conversations[0].value:" in messages and "user turn is empty" in messages
    assert ".content" not in messages and ".role" not in messages


@pytest.mark.parametrize(
    "fmt_row, field",
    [
        ({"instruction": "", "output": "o"}, "instruction"),
        ({"prompt": "", "completion": "c"}, "prompt"),
    ],
)
def test_empty_prompt_of_flat_formats_names_the_column(tmp_path, fmt_row, field):
    report = _check(tmp_path, [fmt_row, {**fmt_row, field: "fine"}])
    assert report.rows_kept == 1
    (message,) = report.skipped_examples
    assert f":1: {field}: the user turn is empty" in message


def test_no_known_format_is_said_once_with_a_suggested_mapping(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(45)]
    report = _check(tmp_path, rows)
    assert report.rows_kept == 0 and report.skipped == {"unknown format": 45}
    (message,) = report.skipped_examples
    assert ":1:" in message and "question, answer" in message
    assert '{prompt = "question", completion = "answer"}' in message
    assert "and 44 more rows like it" in message


def test_mapping_from_the_suggestion_reads_every_row(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(5)]
    report = _check(tmp_path, rows, columns={"prompt": "question", "completion": "answer"})
    assert report.rows_kept == 5


@pytest.mark.parametrize(
    "columns, suggestion",
    [
        (["question", "answer"], '{prompt = "question", completion = "answer"}'),
        (["input", "response", "id"], '{prompt = "input", completion = "response"}'),
        (["dialog"], '{messages = "dialog"}'),
        (["body"], '{text = "body"}'),
    ],
)
def test_suggest_columns(columns, suggestion):
    assert suggest_columns(columns) == suggestion


def test_reversed_column_mapping_is_a_config_error_that_shows_the_right_direction():
    with pytest.raises(ConfigError) as e:
        DataConfig(columns={"question": "prompt", "answer": "completion"})
    assert "data.columns" in e.value.message
    assert '{prompt = "question", completion = "answer"}' in e.value.advice


def test_unknown_column_key_is_a_config_error_listing_the_keys():
    with pytest.raises(ConfigError) as e:
        DataConfig(columns={"dialogue": "chat"})
    assert "'dialogue'" in e.value.message and "messages" in e.value.advice


def test_json_list_in_a_csv_cell_reports_the_column_python_reports(tmp_path):
    cell = '[{"role": "user", "content": "q"}, {"role": "assistant" "content": "a"}]'
    try:
        json.loads(cell)
    except json.JSONDecodeError as e:
        column = e.colno
    path = tmp_path / "c.csv"
    path.write_text('messages\n"' + cell.replace('"', '""') + '"\n', encoding="utf-8")
    report, _ = check_data(DataConfig(train=[str(path)]))
    (message,) = report.skipped_examples
    assert f"column {column})" in message

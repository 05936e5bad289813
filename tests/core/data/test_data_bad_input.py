"""Malformed input, one case each: the bad row (or source) is reported with its file, row and field and a
reason, and every good row next to it still loads. Nothing raises except where no row at all is usable."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from data_helpers import chat

from hone.core.config import DataConfig
from hone.core.data import check_data, load_training_data
from hone.core.errors import DataError

GOOD = chat("What is 2+2?", "4")
GOOD_LINE = json.dumps(GOOD)


def _jsonl(*rows) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def _png(path: Path, size=(8, 6)) -> Path:
    from PIL import Image

    Image.new("RGB", size, "red").save(path)
    return path


def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)
    return path


def _parquet(table_rows: list[dict], schema=None):
    def write(path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(table_rows, schema=schema), path)

    return write


def _parquet_duplicate_columns(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table([pa.array(["a"]), pa.array(["c"])], names=["text", "text"])
    pq.write_table(table, path)


def _image_row(image, text="What is this?"):
    return {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]},
            {"role": "assistant", "content": "A red square."},
        ]
    }


# (case id, file name, content, skip reason, words the message must hold, good rows that must still load)
ROW_CASES = [
    (
        "truncated JSON line",
        "a.jsonl",
        _jsonl(GOOD, '{"messages": [{"role": "user", "con'),
        "invalid JSON",
        [":2:", "not valid JSON"],
        1,
    ),
    ("line is a list", "a.jsonl", _jsonl(GOOD, [1, 2]), "not an object", [":2:", "list"], 1),
    ("line is a string", "a.jsonl", _jsonl('"hello"', GOOD), "not an object", [":1:", "string"], 1),
    ("missing messages", "a.jsonl", _jsonl(GOOD, {"msgs": []}), "missing field", [":2: messages:", "missing"], 1),
    ("empty messages", "a.jsonl", _jsonl(GOOD, {"messages": []}), "empty conversation", [":2: messages:"], 1),
    ("messages is text", "a.jsonl", _jsonl(GOOD, {"messages": "hi there"}), "wrong type", [":2: messages:"], 1),
    (
        "messages is an object",
        "a.jsonl",
        _jsonl(GOOD, {"messages": {"role": "user"}}),
        "wrong type",
        [":2: messages:", "an object"],
        1,
    ),
    ("messages is null", "a.jsonl", _jsonl(GOOD, {"messages": None}), "wrong type", [":2: messages:", "null"], 1),
    ("turn is a string", "a.jsonl", _jsonl(GOOD, {"messages": ["hi", "yo"]}), "wrong type", [":2: messages[0]:"], 1),
    (
        "role missing",
        "a.jsonl",
        _jsonl(GOOD, {"messages": [{"content": "hi"}]}),
        "missing field",
        [":2: messages[0].role:"],
        1,
    ),
    (
        "role is a number",
        "a.jsonl",
        _jsonl(GOOD, {"messages": [{"role": 1, "content": "hi"}]}),
        "wrong type",
        [":2: messages[0].role:"],
        1,
    ),
    (
        "unknown role",
        "a.jsonl",
        _jsonl(GOOD, {"messages": [{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}]}),
        "unknown role",
        [":2: messages[1].role:", "'narrator'", "system, user, assistant"],
        1,
    ),
    (
        "content missing",
        "a.jsonl",
        _jsonl(GOOD, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]}),
        "missing field",
        [":2: messages[1].content:"],
        1,
    ),
    (
        "content is a number",
        "a.jsonl",
        _jsonl(GOOD, {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "5"}]}),
        "wrong type",
        [":2: messages[0].content:", "a number"],
        1,
    ),
    (
        "unknown part type",
        "a.jsonl",
        _jsonl(
            GOOD,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "audio", "audio": "x.wav"}]},
                    {"role": "assistant", "content": "y"},
                ]
            },
        ),
        "wrong type",
        [":2: messages[0].content[0].type:", "'audio'"],
        1,
    ),
    (
        "text part not a string",
        "a.jsonl",
        _jsonl(
            GOOD,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": ["x"]}]},
                    {"role": "assistant", "content": "y"},
                ]
            },
        ),
        "wrong type",
        [":2: messages[0].content[0].text:"],
        1,
    ),
    (
        "no assistant turn",
        "a.jsonl",
        _jsonl(GOOD, chat("only a question")),
        "no assistant turn",
        [":2: messages:", "train_on"],
        1,
    ),
    (
        "empty assistant turn",
        "a.jsonl",
        _jsonl(chat("q", "   "), GOOD),
        "empty content",
        [":1: messages[1].content:"],
        1,
    ),
    (
        "unknown columns",
        "a.jsonl",
        _jsonl({"question": "q", "answer": "a"}, GOOD),
        "unknown format",
        [":1:", "question, answer", "data.columns"],
        1,
    ),
    (
        "invalid UTF-8 line",
        "a.jsonl",
        _jsonl(GOOD) + b'{"messages": "\xff\xfe"}\n' + _jsonl(GOOD),
        "invalid UTF-8",
        [":2:", "UTF-8"],
        2,
    ),
    (
        "alpaca output not a string",
        "a.jsonl",
        _jsonl({"instruction": "i", "output": "o"}, {"instruction": "i", "output": 3}),
        "wrong type",
        [":2: output:"],
        1,
    ),
    (
        "sharegpt unknown speaker",
        "a.json",
        json.dumps(
            [
                {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
                {"conversations": [{"from": "human", "value": "q"}, {"from": "narrator", "value": "a"}]},
            ]
        ).encode(),
        "unknown role",
        [":2: conversations[1].from:"],
        1,
    ),
    ("empty text row", "a.jsonl", _jsonl({"text": "fine"}, {"text": "  "}), "empty text", [":2: text:"], 1),
    (
        "JSON list element not an object",
        "a.json",
        json.dumps([GOOD, 7, GOOD]).encode(),
        "not an object",
        [":2:", "number"],
        2,
    ),
    (
        "CSV quoting error",
        "a.csv",
        b'text,id\nhello,1\n"bad"quote,2\nworld,3\n',
        "malformed record",
        [":3:", "quoting", "line 3"],
        2,
    ),
    (
        "CSV unclosed quote",
        "a.csv",
        b'text,id\nhello,1\n"never closed,2\nworld,3\n',
        "malformed record",
        [":3:", "quoting", "lines 3-4"],
        1,
    ),
    (
        "CSV wrong field count",
        "a.csv",
        b"text,id\nhello,1\na,b,c\nworld,3\n",
        "malformed record",
        [":3:", "3 fields", "header has 2"],
        2,
    ),
    ("CSV invalid UTF-8", "a.csv", b"text,id\nhello,1\nbad \xff byte,2\n", "invalid UTF-8", [":3: text:"], 1),
    (
        "CSV duplicate column",
        "a.csv",
        b"text,text\nhello,world\n",
        "duplicate column",
        [":2: text:", "columns 1 and 2"],
        0,
    ),
    (
        "CSV messages not JSON",
        "a.csv",
        b'messages\n"[{""role"": ""user"", ""content"": ""q""}, {""role"": '
        b'""assistant"", ""content"": ""a""}]"\n"[{""role"": ""user"""\n',
        "wrong type",
        [":3: messages:", "JSON list"],
        1,
    ),
    (
        "Parquet null inside a list",
        "a.parquet",
        _parquet([GOOD, {"messages": [{"role": "user", "content": "q"}, None]}]),
        "wrong type",
        [":2: messages[1]:", "null"],
        1,
    ),
    (
        "Parquet null struct field",
        "a.parquet",
        _parquet([GOOD, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]}]),
        "empty content",
        [":2: messages[1].content:"],
        1,
    ),
    (
        "Parquet null column",
        "a.parquet",
        _parquet([GOOD, {"messages": None}]),
        "wrong type",
        [":2: messages:", "null"],
        1,
    ),
    (
        "Parquet duplicate columns",
        "a.parquet",
        _parquet_duplicate_columns,
        "duplicate column",
        [":1: text:", "appears twice"],
        0,
    ),
    (
        "duplicate column that no format uses is fine",
        "a.csv",
        b"text,id,id\nhello,1,2\n,3,4\n",
        "empty text",
        [":3: text:"],
        1,
    ),
    (
        "missing image file",
        "a.jsonl",
        _jsonl(GOOD, _image_row("pics/nowhere.png")),
        "image missing",
        [":2: image 1:", "nowhere.png", "does not exist"],
        1,
    ),
    (
        "corrupt image",
        "a.jsonl",
        lambda p: (
            p.parent.joinpath("bad.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really"),
            p.write_bytes(_jsonl(_image_row("bad.png"), GOOD)),
        ),
        "image unreadable",
        [":1: image 1:", "bad.png", "cannot be decoded"],
        1,
    ),
    (
        "truncated image",
        "a.jsonl",
        lambda p: (
            _png(p.parent / "cut.png", (64, 64)),
            p.parent.joinpath("cut.png").write_bytes(p.parent.joinpath("cut.png").read_bytes()[:60]),
            p.write_bytes(_jsonl(_image_row("cut.png"), GOOD)),
        ),
        "image unreadable",
        [":1: image 1:", "cut.png"],
        1,
    ),
    (
        "image path is a folder",
        "a.jsonl",
        lambda p: (p.parent.joinpath("dir.png").mkdir(), p.write_bytes(_jsonl(_image_row("dir.png"), GOOD))),
        "image missing",
        [":1: image 1:", "is a folder"],
        1,
    ),
    (
        "bad base64 image",
        "a.jsonl",
        _jsonl(GOOD, _image_row("data:image/png;base64,@@@@")),
        "wrong type",
        [":2: messages[0].content[0]:", "base64"],
        1,
    ),
    (
        "image part without image",
        "a.jsonl",
        _jsonl(
            GOOD,
            {"messages": [{"role": "user", "content": [{"type": "image"}]}, {"role": "assistant", "content": "x"}]},
        ),
        "missing field",
        [":2: messages[0].content[0].image:"],
        1,
    ),
    (
        "placeholder count mismatch",
        "a.jsonl",
        _jsonl(
            GOOD,
            {
                "messages": [
                    {"role": "user", "content": "<image><image> compare"},
                    {"role": "assistant", "content": "same"},
                ],
                "images": ["a.png"],
            },
        ),
        "image placeholder mismatch",
        [":2: images:", "1 image(s)", "2 <image>"],
        1,
    ),
]


@pytest.mark.parametrize("case", ROW_CASES, ids=[c[0] for c in ROW_CASES])
def test_bad_row_is_reported_and_good_rows_load(tmp_path, case):
    _, name, content, reason, words, kept = case
    path = _write(tmp_path, name, content)
    report, _ = check_data(DataConfig(train=[str(path)]))
    assert report.skipped.get(reason) == 1, f"expected one {reason!r} skip, got {report.skipped}"
    assert report.rows_kept == kept, f"good rows: {report.rows_kept}, expected {kept}"
    assert report.rows_read == report.rows_kept + sum(report.skipped.values())
    matching = [m for m in report.skipped_examples if all(w in m for w in words)]
    assert matching, f"no skipped message holds {words}: {report.skipped_examples}"
    assert matching[0].startswith(f"{path}:"), matching[0]


# (case id, file name, content, words of the problem)
SOURCE_CASES = [
    ("0-byte file", "a.jsonl", b"", ["a.jsonl", "empty (0 bytes)"]),
    ("whole JSON file invalid", "a.json", b'[{"messages": []},\n {"oops"\n', ["a.json", "not valid JSON", "line 3"]),
    ("JSON top level is a string", "a.json", b'"just text"', ["a.json", "JSON string"]),
    ("JSON file with invalid UTF-8", "a.json", b'[{"text": "\xff"}]', ["a.json", "UTF-8", "line 1"]),
    ("unknown extension", "a.txt", b"hello", ["a.txt", "unknown file type", ".jsonl"]),
    ("damaged Parquet", "a.parquet", b"PAR1 this is not parquet at all PAR1", ["a.parquet", "not a readable Parquet"]),
    ("garbage Arrow", "a.arrow", b"not arrow data", ["a.arrow", "not a readable Arrow"]),
]


@pytest.mark.parametrize("case", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_unreadable_source_is_named_and_other_sources_still_load(tmp_path, case):
    _, name, content, words = case
    bad = _write(tmp_path, name, content)
    good = _write(tmp_path, "good.jsonl", _jsonl(GOOD, GOOD))
    report, _ = check_data(DataConfig(train=[str(bad), str(good)]))
    assert report.rows_kept == 2
    assert len(report.problems) == 1 and all(w in report.problems[0] for w in words), report.problems


def test_directory_without_data_files(tmp_path):
    (tmp_path / "empty").mkdir()
    good = _write(tmp_path, "good.jsonl", _jsonl(GOOD))
    report, _ = check_data(DataConfig(train=[str(tmp_path / "empty"), str(good)]))
    assert report.rows_kept == 1
    assert "is a folder without dataset files" in report.problems[0]


def test_missing_path_and_offline_hub_id(tmp_path):
    good = _write(tmp_path, "good.jsonl", _jsonl(GOOD))
    report, _ = check_data(DataConfig(train=[str(tmp_path / "nope.jsonl"), "hone-tests/not-cached-dataset", str(good)]))
    assert report.rows_kept == 1
    assert any("nope.jsonl does not exist" in p for p in report.problems), report.problems
    relative, _ = check_data(DataConfig(train=["data/missing.jsonl", str(good)]))
    assert relative.problems == [
        "data/missing.jsonl does not exist (not a file, a folder or a Hugging Face dataset id like org/name)"
    ]
    hub = [p for p in report.problems if "hone-tests/not-cached-dataset" in p]
    assert hub and "cannot be loaded" in hub[0] and "offline" in hub[0], report.problems


def test_utf8_bom_is_accepted(tmp_path):
    path = _write(tmp_path, "a.jsonl", b"\xef\xbb\xbf" + _jsonl(GOOD, GOOD))
    csv_path = _write(tmp_path, "b.csv", b"\xef\xbb\xbftext\nhello\n")
    report, _ = check_data(DataConfig(train=[str(path), str(csv_path)], train_on="all"))
    assert report.rows_kept == 3 and not report.skipped


def test_zero_byte_file_alone_is_a_data_error(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path, "a.jsonl", b"")
    with pytest.raises(DataError, match="empty"):
        load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer)


def test_row_longer_than_limit_with_drop(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path, "a.jsonl", _jsonl(GOOD, chat("long " * 200, "ok")))
    report, _ = check_data(DataConfig(train=[str(path)], max_length=64, overlong="drop"), smollm2_tokenizer)
    assert report.skipped == {"longer than max_length": 1} and report.rows_kept == 1
    assert report.skipped_examples[0].startswith(f"{path}:2: has ")


def test_template_that_raises_skips_only_that_row(tmp_path, gemma_tokenizer):
    """Gemma's template refuses a conversation the assistant opens (which Hone keeps, with a note); the row is
    skipped with the template's own message."""
    bad = {
        "messages": [
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"},
        ]
    }
    path = _write(tmp_path, "a.jsonl", _jsonl(GOOD, bad))
    data = load_training_data(DataConfig(train=[str(path)]), gemma_tokenizer)
    report = data.reports[0]
    assert report.skipped == {"chat template error": 1} and report.rows_kept == 1
    assert f"{path}:2" in report.skipped_examples[0] and "must alternate" in report.skipped_examples[0]


def test_image_row_for_a_text_only_model(tmp_path, smollm2_tokenizer):
    _png(tmp_path / "red.png")
    path = _write(tmp_path, "a.jsonl", _jsonl(_image_row("red.png"), GOOD))
    report, _ = check_data(DataConfig(train=[str(path)]), smollm2_tokenizer)
    assert report.skipped == {"image row for a text-only model": 1} and report.rows_kept == 1
    assert "vision-language model" in report.skipped_examples[0]


def test_base64_and_bytes_images_are_accepted(tmp_path):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    noise = bytes(range(256)) * 12  # 32x32 RGB of varied bytes: a PNG long enough to read as bare base64
    Image.frombytes("RGB", (32, 32), noise).save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    path = _write(tmp_path, "a.jsonl", _jsonl(_image_row(f"data:image/png;base64,{encoded}"), _image_row(encoded)))
    report, _ = check_data(DataConfig(train=[str(path)]))
    assert report.rows_kept == 2 and report.image_rows == 2 and not report.skipped

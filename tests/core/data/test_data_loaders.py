"""Every container format yields the same records with the right row numbers: JSONL, JSON (list, columns,
wrapped, single row, JSONL named .json), CSV, TSV, Parquet, Arrow (file and stream), `datasets` folders (with
splits), folders of files and `bundled:` names."""

from __future__ import annotations

import json

import pytest

from hone.core.config import DataConfig
from hone.core.data import check_data
from hone.core.data.loaders import SourceError, read_records, resolve_sources

ROWS = [{"instruction": f"question {i}", "output": f"answer {i}"} for i in range(5)]


def _records(entry: str, side: str = "train") -> list:
    (source,) = resolve_sources([entry], side=side)
    return list(read_records(source))


def _numbered(rows, start=1):
    return [(start + i, r) for i, r in enumerate(rows)]


def test_jsonl_numbers_are_lines_and_blank_lines_are_not_rows(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS[:2]) + "\n\n" + json.dumps(ROWS[2]) + "\n")
    assert _records(str(path)) == [(1, ROWS[0]), (2, ROWS[1]), (4, ROWS[2])]


@pytest.mark.parametrize("layout", ["list", "columns", "wrapped", "jsonl content"])
def test_json_layouts(tmp_path, layout):
    path = tmp_path / "a.json"
    if layout == "list":
        path.write_text(json.dumps(ROWS))
    elif layout == "columns":
        path.write_text(json.dumps({k: [r[k] for r in ROWS] for k in ROWS[0]}))
    elif layout == "wrapped":
        path.write_text(json.dumps({"data": ROWS}))
    else:
        path.write_text("\n".join(json.dumps(r) for r in ROWS))
    assert _records(str(path)) == _numbered(ROWS)


def test_json_single_conversation_object_is_one_row(tmp_path):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = tmp_path / "a.json"
    path.write_text(json.dumps(row))
    assert _records(str(path)) == [(1, row)]


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_csv_and_tsv_with_quoted_multiline_fields(tmp_path, suffix, sep):
    path = tmp_path / f"a{suffix}"
    rows = [*ROWS[:2], {"instruction": f'line one{sep} still\n"line two"', "output": "x"}]
    body = "".join(sep.join('"' + v.replace('"', '""') + '"' for v in r.values()) + "\n" for r in rows)
    path.write_text(sep.join(rows[0]) + "\n" + body)
    # Spreadsheet numbering: the header is row 1.
    assert _records(str(path)) == _numbered(rows, start=2)


def test_csv_conversations_as_json_cells_load(tmp_path):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path = tmp_path / "a.csv"
    path.write_text('messages\n"' + json.dumps(messages).replace('"', '""') + '"\n')
    report, _ = check_data(DataConfig(train=[str(path)]))
    assert report.rows_kept == 1 and report.format == "messages"


def test_parquet_and_arrow(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(ROWS)
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2)
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=3)
    for name in ("a.parquet", "file.arrow", "stream.arrow"):
        assert _records(str(tmp_path / name)) == _numbered(ROWS), name


def test_datasets_folders_with_splits(tmp_path):
    import datasets

    train = datasets.Dataset.from_list(ROWS[:3])
    test = datasets.Dataset.from_list(ROWS[3:])
    train.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    assert _records(str(tmp_path / "single")) == _numbered(ROWS[:3])
    assert _records(str(tmp_path / "dict")) == _numbered(ROWS[:3])
    assert _records(str(tmp_path / "dict"), side="eval") == _numbered(ROWS[3:])
    assert _records(f"{tmp_path / 'dict'}:test") == _numbered(ROWS[3:])
    with pytest.raises(SourceError, match="has no split 'dev'; it has train, test"):
        _records(f"{tmp_path / 'dict'}:dev")


def test_datasets_image_columns_come_undecoded(tmp_path):
    import datasets
    from PIL import Image

    Image.new("RGB", (4, 4), "red").save(tmp_path / "red.png")
    ds = datasets.Dataset.from_dict(
        {
            "messages": [[{"role": "user", "content": "<image>What color?"}, {"role": "assistant", "content": "Red."}]],
            "images": [[str(tmp_path / "red.png")]],
        }
    )
    ds = ds.cast_column("images", datasets.Sequence(datasets.Image()))
    ds.save_to_disk(str(tmp_path / "vision"))
    report, _ = check_data(DataConfig(train=[str(tmp_path / "vision")]))
    assert report.rows_kept == 1 and report.image_rows == 1, report


def test_folder_of_files_reads_each_in_name_order(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    (folder / "b.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    (folder / "a.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (folder / "notes.txt").write_text("not data")
    sources = resolve_sources([str(folder)])
    assert [s.name for s in sources] == [str(folder / "a.jsonl"), str(folder / "b.jsonl")]


def test_bundled_samples_all_load_cleanly():
    for name in ("chat.jsonl", "alpaca.jsonl", "sharegpt.json", "pretrain.jsonl", "vision/shapes.jsonl"):
        report, _ = check_data(DataConfig(train=[f"bundled:samples/{name}"]))
        assert report.rows_kept == report.rows_read > 0 and not report.skipped and not report.problems, name
        if name.startswith("vision"):
            assert 0 < report.image_rows < report.rows_kept  # image rows and text-only rows together


def test_hub_id_with_split_is_parsed_not_taken_for_a_path():
    (source,) = resolve_sources(["someorg/somedata:validation"], side="eval")
    assert (source.kind, source.name, source.split) == ("hub", "someorg/somedata", "validation")

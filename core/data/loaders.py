"""Read dataset sources into raw records, one at a time, with their row numbers.

`resolve_sources` turns `DataConfig.train` / `eval` entries into `Source`s and `read_records` streams each one, so
a large file is never held whole in memory. Readers never raise on a bad row: they yield a `RowProblem` for it and
go on. Problems with a whole file (missing, empty, not parseable at all) raise `SourceError`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.core.data.hub_datasets import HubDatasetUnavailable, load_hub_dataset
from hone.core.data.rows import (
    BAD_RECORD,
    EMPTY_FILE,
    INVALID_JSON,
    INVALID_UTF8,
    NOT_AN_OBJECT,
    TOO_DEEP,
    UNREADABLE_FILE,
    RowProblem,
)
from hone.core.resources import BUNDLED_PREFIX, resolve_bundled

SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
# Rows per record batch when streaming Parquet, Arrow and `datasets` tables: large enough to amortize the
# conversion, small enough to keep memory flat.
_BATCH_ROWS = 1024
# Hashing reads files in chunks of this many bytes.
_HASH_CHUNK = 1 << 20
# Deepest nesting of objects and lists a JSON row may have. Real rows need 3-6 levels (row, messages, turn, content
# parts, tool-call arguments); 64 leaves room for any of them, while a row nested hundreds deep would exceed Python's
# recursion limit in the parser or in a later step (format detection, the chat template) and is hostile or broken.
MAX_JSON_DEPTH = 64
_SURROGATE_RE = re.compile("[\udc80-\udcff]")
_SPLIT_RE = re.compile(r"^(?P<name>.+?):(?P<split>[A-Za-z_][\w.\-]*)$")
_TRAIN_SPLITS = ("train",)
# Key of a record's {column: message} for same-named columns (a NUL can start no real column name).
DUPLICATES_KEY = "\0duplicate columns"
_EVAL_SPLITS = ("validation", "valid", "val", "test", "eval", "dev")


class JsonTooDeep(ValueError):
    """A JSON text nests objects and lists more than MAX_JSON_DEPTH levels deep."""

    def __init__(self):
        super().__init__(f"it nests objects and lists more than {MAX_JSON_DEPTH} levels deep (a row needs a few)")


def loads_json(text: str):
    """json.loads, refusing nesting deeper than MAX_JSON_DEPTH (instead of a RecursionError, or a value that breaks
    later steps).

    Raises:
        json.JSONDecodeError: not valid JSON.
        JsonTooDeep: valid or not, nested too deeply.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonTooDeep() from None
    # Nesting needs an opening bracket per level, and counting them runs at C speed: most rows need no walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and nesting_exceeds(value, MAX_JSON_DEPTH):
        raise JsonTooDeep()
    return value


def nesting_exceeds(value, limit: int) -> bool:
    """Whether dicts and lists nest more than `limit` levels deep in `value` (iteratively, so depth costs no stack)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack += [(child, depth + 1) for child in children if isinstance(child, (dict, list))]
    return False


class SourceError(Exception):
    """A whole source cannot be read; `reason` is a rows.* file-level key, the message names the source."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Source:
    """One readable source.

    Attributes:
        name: how messages name it (the entry as the user wrote it, or the file inside a folder entry).
        kind: jsonl | json | csv | tsv | parquet | arrow | disk | hub.
        path: the local file or folder (None for hub ids).
        split: the split to read for `disk` and `hub` sources ("" = choose by side).
        base_dir: folder that relative image paths resolve against.
        side: "train" or "eval", which decides the default split of `disk` and `hub` sources.
    """

    name: str
    kind: str
    path: Path | None
    split: str = ""
    base_dir: Path | None = None
    side: str = "train"


def resolve_sources(entries: list[str], side: str = "train") -> list[Source]:
    """Turn config entries into Sources.

    An entry is a JSONL, JSON (a list of rows, a dict of columns, or one row), CSV/TSV, Parquet or Arrow file, a
    folder saved by `datasets.save_to_disk`, a folder holding such files (one Source per file), a `bundled:` name
    or a Hugging Face dataset id. Append `:split` to a Hugging Face id or a saved DatasetDict folder to pick a split
    (`org/name:test`); without it the training side reads "train", the evaluation side "validation" or "test".

    Raises:
        SourceError: an entry names nothing readable (the message says what was found instead).
    """
    sources: list[Source] = []
    for entry in entries:
        sources += _resolve_one(str(entry), side)
    return sources


def _resolve_one(entry: str, side: str) -> list[Source]:
    name, split = entry, ""
    if entry.startswith(BUNDLED_PREFIX):
        try:
            path = resolve_bundled(entry)
        except Exception as e:
            raise SourceError(UNREADABLE_FILE, str(e)) from None
    else:
        path = Path(entry).expanduser()
        if not path.exists():
            match = _SPLIT_RE.match(entry)
            if match and len(match["name"]) > 1:  # "C:..." is a drive, not a split
                name, split = match["name"], match["split"]
                path = Path(name).expanduser()
    if path.is_file():
        kind = SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise SourceError(
                UNREADABLE_FILE,
                f"{entry}: unknown file type {path.suffix!r}; use .jsonl, .json, .csv, .tsv, .parquet or .arrow",
            )
        return [Source(entry, kind, path, split, path.parent, side)]
    if path.is_dir():
        if (
            (path / "dataset_info.json").exists()
            or (path / "dataset_dict.json").exists()
            or (path / "state.json").exists()
        ):
            return [Source(name, "disk", path, split, path, side)]
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not files:
            raise SourceError(
                UNREADABLE_FILE,
                f"{entry} is a folder without dataset files (.jsonl, .json, .csv, "
                ".tsv, .parquet, .arrow) and was not saved by datasets.save_to_disk",
            )
        return [Source(str(Path(entry) / f.name), SUFFIXES[f.suffix.lower()], f, "", path, side) for f in files]
    other = not_regular_file(path) if path.exists() else None
    if other:  # stat only: opening a FIFO would wait for a writer, /dev/zero would never end
        raise SourceError(UNREADABLE_FILE, f"{entry} is {other}, not a data file or a folder")
    looks_like_file = Path(name).suffix.lower() in SUFFIXES
    if (
        "/" in name
        and not name.startswith((".", "/", "~"))
        and name.count("/") == 1
        and "\\" not in name
        and not looks_like_file
    ):
        return [Source(name, "hub", None, split, None, side)]
    raise SourceError(
        UNREADABLE_FILE, f"{entry} does not exist (not a file, a folder or a Hugging Face dataset id like org/name)"
    )


def not_regular_file(path) -> str | None:
    """What `path` is when it is not a regular file ("a FIFO (named pipe)", "a folder", ...), else None; from its
    stat, so nothing is opened.

    Raises:
        OSError: the path cannot be looked at (FileNotFoundError when there is nothing there).
    """
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def content_hash(source: Source) -> str:
    """A hash of the source's content (file bytes; for folders every file; for hub ids the datasets fingerprint)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{source.kind}|{source.split}|".encode())
    if source.kind == "hub":
        digest.update(_load_hub(source)._fingerprint.encode())
        return digest.hexdigest()
    assert source.path is not None
    files = [source.path] if source.path.is_file() else sorted(p for p in source.path.rglob("*") if p.is_file())
    for f in files:
        digest.update(str(f.relative_to(source.path) if f != source.path else f.name).encode())
        with open(f, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def read_records(source: Source) -> Iterator[tuple[int, Any]]:
    """Yield (row number, record dict or RowProblem) for every row of the source.

    Files are streamed: JSONL line by line, CSV row by row, Parquet/Arrow in record batches, memory-mapped. Row
    numbers are 1-based: the line for JSONL, the element for JSON lists, the spreadsheet row for CSV/TSV (the
    header is row 1), the table row for Parquet, Arrow and `datasets` folders.

    Raises:
        SourceError: the source as a whole cannot be read.
    """
    if source.kind in ("jsonl", "json", "csv", "tsv", "parquet", "arrow"):
        assert source.path is not None
        try:
            size = source.path.stat().st_size
        except OSError as e:
            raise SourceError(UNREADABLE_FILE, f"{source.name} cannot be read: {e.strerror}") from None
        if size == 0:
            raise SourceError(EMPTY_FILE, f"{source.name} is empty (0 bytes)")
    readers = {
        "jsonl": _read_jsonl,
        "json": _read_json,
        "csv": _read_csv,
        "tsv": _read_csv,
        "parquet": _read_parquet,
        "arrow": _read_arrow,
        "disk": _read_datasets,
        "hub": _read_datasets,
    }
    yield from readers[source.kind](source)


def _problem(source: Source, row: int, reason: str, detail: str, field: str = "") -> RowProblem:
    return RowProblem(f"{source.name}:{row}", reason, field, detail)


def _read_jsonl(source: Source) -> Iterator[tuple[int, Any]]:
    assert source.path is not None  # a file source
    with open(source.path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some Windows editors write
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield (
                    number,
                    _problem(
                        source,
                        number,
                        INVALID_UTF8,
                        f"byte {e.start + 1} of the line is not valid UTF-8; save the file as UTF-8",
                    ),
                )
                continue
            try:
                record = loads_json(line)
            except json.JSONDecodeError as e:
                yield (
                    number,
                    _problem(
                        source,
                        number,
                        INVALID_JSON,
                        f"the line is not valid JSON ({e.msg} at column {e.colno}); fix or remove it",
                    ),
                )
                continue
            except JsonTooDeep as e:
                yield number, _problem(source, number, TOO_DEEP, f"the line is not a usable row: {e}; fix or remove it")
                continue
            if not isinstance(record, dict):
                yield (
                    number,
                    _problem(
                        source,
                        number,
                        NOT_AN_OBJECT,
                        f'the line is a JSON {_json_kind(record)}, expected an object like {{"messages": [...]}}',
                    ),
                )
                continue
            yield number, record


def _read_json(source: Source) -> Iterator[tuple[int, Any]]:
    assert source.path is not None  # a file source
    data = source.path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise SourceError(
            UNREADABLE_FILE,
            f"{source.name}: byte {e.start + 1} (line {line}) is not valid UTF-8; save the file as UTF-8",
        ) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # one object per line: it is JSONL with a .json name
            yield from _read_jsonl(source)
            return
        raise SourceError(
            UNREADABLE_FILE,
            f"{source.name} is not valid JSON ({e.msg} at line {e.lineno}, column "
            f"{e.colno}); fix the file or convert it to JSONL, where one bad row skips only "
            "that row",
        ) from None
    except RecursionError:
        raise SourceError(
            UNREADABLE_FILE,
            f"{source.name} cannot be read: somewhere it nests objects and lists "
            f"hundreds of levels deep (a row needs a few); convert it to JSONL, where such a row skips "
            "only itself",
        ) from None
    if isinstance(value, dict):
        rows = _rows_of_dict(value)
        if rows is None:
            yield (
                1,
                (
                    _problem(source, 1, TOO_DEEP, f"the object is not a usable row: {JsonTooDeep()}")
                    if nesting_exceeds(value, MAX_JSON_DEPTH)
                    else value
                ),
            )
            return
        value = rows
    if not isinstance(value, list):
        raise SourceError(
            UNREADABLE_FILE,
            f"{source.name} holds a JSON {_json_kind(value)}; expected a list of rows or an object of columns",
        )
    for number, record in enumerate(value, start=1):
        if not isinstance(record, dict):
            yield (
                number,
                _problem(source, number, NOT_AN_OBJECT, f"element is a JSON {_json_kind(record)}, expected an object"),
            )
            continue
        if nesting_exceeds(record, MAX_JSON_DEPTH):
            yield number, _problem(source, number, TOO_DEEP, f"element is not a usable row: {JsonTooDeep()}")
            continue
        yield number, record


def _rows_of_dict(value: dict) -> list | None:
    """Rows of a JSON object: a dict of equal-length columns, or {"key": [rows]}; None = the object is one row."""
    if any(
        isinstance(value.get(k), list) and value[k] and all(isinstance(t, dict) for t in value[k])
        for k in ("messages", "conversations")
    ):
        return None
    columns = [v for v in value.values() if isinstance(v, list)]
    if columns and len(columns) == len(value) and len({len(c) for c in columns}) == 1:
        if len(value) == 1 and all(isinstance(r, dict) for r in columns[0]):
            return columns[0]  # {"data": [{...}, {...}]}
        return [dict(zip(value, items, strict=True)) for items in zip(*value.values(), strict=True)]
    return None


def _read_csv(source: Source) -> Iterator[tuple[int, Any]]:
    delimiter = "\t" if source.kind == "tsv" else ","
    assert source.path is not None  # a file source
    with open(source.path, encoding="utf-8-sig", errors="surrogateescape", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise SourceError(UNREADABLE_FILE, f"{source.name}: the header row cannot be read ({e})") from None
        if any(_SURROGATE_RE.search(h) for h in header):
            raise SourceError(
                UNREADABLE_FILE, f"{source.name}: the header row is not valid UTF-8; save the file as UTF-8"
            )
        duplicates = _duplicates(header)
        number = 1
        while True:
            first_line = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                number += 1
                lines = (
                    f"line {first_line}" if reader.line_num <= first_line else f"lines {first_line}-{reader.line_num}"
                )
                yield (
                    number,
                    _problem(
                        source,
                        number,
                        BAD_RECORD,
                        f"CSV quoting error on {lines} ({e}); a quote "
                        'inside a field must be doubled ("") and a quoted field closed',
                    ),
                )
                continue
            number += 1
            if not cells:
                continue
            if len(cells) != len(header):
                yield (
                    number,
                    _problem(
                        source,
                        number,
                        BAD_RECORD,
                        f"has {len(cells)} fields but the header has "
                        f"{len(header)}; check for a stray {'tab' if delimiter == chr(9) else 'comma'}"
                        " or an unquoted field",
                    ),
                )
                continue
            if any(_SURROGATE_RE.search(c) for c in cells):
                column = header[next(i for i, c in enumerate(cells) if _SURROGATE_RE.search(c))]
                yield (
                    number,
                    _problem(source, number, INVALID_UTF8, "is not valid UTF-8; save the file as UTF-8", column),
                )
                continue
            yield number, _record(header, cells, duplicates)


def _duplicates(names: list[str]) -> dict[str, str]:
    """Column name -> message, for every name that appears more than once."""
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for i, name in enumerate(names):
        if name in seen and name not in out:
            out[name] = (
                f"appears twice (columns {seen[name] + 1} and {i + 1}), so its value is ambiguous; rename one of them"
            )
        seen.setdefault(name, i)
    return out


def _record(names: list[str], values: list, duplicates: dict[str, str]) -> dict:
    """A row dict; same-named columns keep their first value and are listed under DUPLICATES_KEY, so a row is
    skipped only when its format uses one of them."""
    record: dict = {}
    for name, value in zip(names, values, strict=True):
        record.setdefault(name, value)
    if duplicates:
        record[DUPLICATES_KEY] = duplicates
    return record


def _read_parquet(source: Source) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table_file = pq.ParquetFile(source.path, memory_map=True)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(UNREADABLE_FILE, f"{source.name} is not a readable Parquet file ({e})") from None
    yield from _read_batches(source, table_file.schema_arrow.names, table_file.iter_batches(batch_size=_BATCH_ROWS))


def _read_arrow(source: Source) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    try:
        mapped = pa.memory_map(str(source.path))
        try:
            reader = pa.ipc.open_file(mapped)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            mapped.seek(0)
            reader = pa.ipc.open_stream(mapped)
            batches = iter(reader)
        names = reader.schema.names
    except (pa.ArrowException, OSError) as e:
        raise SourceError(UNREADABLE_FILE, f"{source.name} is not a readable Arrow file ({e})") from None
    yield from _read_batches(source, names, batches)


def _read_batches(source: Source, names: list[str], batches) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    duplicates = _duplicates(names)
    number = 0
    try:
        for batch in batches:
            if duplicates:  # to_pylist would keep only one of the same-named columns, silently
                columns = [column.to_pylist() for column in batch.columns]
                for values in zip(*columns, strict=True):
                    number += 1
                    yield number, _record(names, list(values), duplicates)
                continue
            for record in batch.to_pylist():
                number += 1
                yield number, record
    except (pa.ArrowException, OSError) as e:
        raise SourceError(
            UNREADABLE_FILE, f"{source.name}: reading stopped after row {number} ({e}); the rest of the file is damaged"
        ) from None


def _load_hub(source: Source):
    """The `datasets` Dataset of a hub id (from the cache when the Hub cannot be reached: hub_datasets) or saved
    folder, with the right split."""
    try:
        if source.kind == "hub":
            loaded = load_hub_dataset(source.name)  # refused within seconds, before `datasets` is imported
        else:
            import datasets

            loaded = datasets.load_from_disk(str(source.path))
    except HubDatasetUnavailable as e:
        raise SourceError(UNREADABLE_FILE, str(e)) from None
    except Exception as e:
        where = "folder" if source.kind == "disk" else "Hugging Face dataset"
        advice = (
            ""
            if source.kind == "disk"
            else "; when offline, a hub dataset must already be in the Hugging "
            "Face cache (or download it elsewhere and give its folder)"
        )
        raise SourceError(
            UNREADABLE_FILE, f"{where} {source.name} cannot be loaded: {_first_line(e)}{advice}"
        ) from None
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[_pick_split(source, list(loaded))]
    return loaded


def _pick_split(source: Source, splits: list[str]) -> str:
    if source.split:
        if source.split not in splits:
            raise SourceError(
                UNREADABLE_FILE, f"{source.name} has no split {source.split!r}; it has {', '.join(splits)}"
            )
        return source.split
    preferred = _TRAIN_SPLITS if source.side == "train" else _EVAL_SPLITS
    for name in preferred:
        if name in splits:
            return name
    if len(splits) == 1:
        return splits[0]
    raise SourceError(
        UNREADABLE_FILE, f"{source.name} has splits {', '.join(splits)}; pick one by writing {source.name}:{splits[0]}"
    )


def _read_datasets(source: Source) -> Iterator[tuple[int, Any]]:
    # The Arrow view gives stored values as they are: images stay {"bytes", "path"} records, decoded only later.
    dataset = _load_hub(source).with_format("arrow")
    number = 0
    for table in dataset.iter(batch_size=_BATCH_ROWS):
        for record in table.to_pylist():
            number += 1
            yield number, record


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "null")


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]

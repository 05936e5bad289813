"""Hostile rows: JSON nested a thousand deep, a 50 MB one-string row, and image paths that lead outside the data
folder. Each bad row is skipped (or kept with a note) with its file:row; none stops `hone data check` or a run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from hone.core.cli import dispatch as cli
from hone.core.config import DataConfig
from hone.core.data import check_data, load_training_data

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
MAX_DEPTH = 64  # the loaders' limit, written out so the messages below are concrete
TOO_DEEP_WHY = f"it nests objects and lists more than {MAX_DEPTH} levels deep (a row needs a few)"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "hone-cache"))
    return tmp_path / "hone-cache" / "datasets"


def nested_row(depth: int) -> str:
    """A JSONL line: a good row whose extra field holds lists nested so the whole row is `depth` levels deep."""
    inner = "[" * (depth - 1) + '"leaf"' + "]" * (depth - 1)
    return json.dumps(GOOD)[:-1] + f', "extra": {inner}}}'


def bracket_depth(text: str) -> int:
    """Deepest nesting of [ and { in a JSON text without brackets inside its strings (the reference count)."""
    depth = deepest = 0
    for char in text:
        depth += (char in "[{") - (char in "]}")
        deepest = max(deepest, depth)
    return deepest


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_row_nested_a_thousand_deep_is_skipped_by_the_check_and_the_run(tmp_path, smollm2_tokenizer):
    good = json.dumps(GOOD)
    lines = [good, nested_row(1000), good, nested_row(200), nested_row(MAX_DEPTH)]
    assert [bracket_depth(line) for line in lines] == [3, 1000, 3, 200, 64]
    path = write_lines(tmp_path / "d.jsonl", lines)
    expected = [
        f"{path}:2: the line is not a usable row: {TOO_DEEP_WHY}; fix or remove it",
        f"{path}:4: the line is not a usable row: {TOO_DEEP_WHY}; fix or remove it",
    ]

    report, _ = check_data(DataConfig(train=[str(path)]))
    assert (report.rows_read, report.rows_kept, report.skipped) == (5, 3, {"nested too deeply": 2})
    assert report.skipped_examples == expected

    data = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer, cache_dir=tmp_path / "cache")
    assert [row.source for row in data.train] == [f"{path}:1", f"{path}:3", f"{path}:5"]
    assert data.reports[0].skipped_examples == expected


def test_hone_data_check_reports_the_deep_row_instead_of_a_traceback(tmp_path, monkeypatch, capsys):
    path = write_lines(tmp_path / "d.jsonl", [json.dumps(GOOD), nested_row(1000)])
    monkeypatch.setattr(cli, "COMMANDS", {"data": cli.COMMANDS["data"]})
    code = cli.main(["data", "check", str(path)])
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.out + out.err
    assert f"{path}:2: the line is not a usable row: {TOO_DEEP_WHY}" in out.out


def test_deep_json_in_a_json_file_and_in_a_csv_cell(tmp_path):
    rows = [GOOD, {**GOOD, "extra": json.loads(nested_row(200))["extra"]}]
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps(rows), encoding="utf-8")
    report, _ = check_data(DataConfig(train=[str(listed)]))
    assert (report.rows_kept, report.skipped) == (1, {"nested too deeply": 1})
    assert report.skipped_examples == [f"{listed}:2: element is not a usable row: {TOO_DEEP_WHY}"]

    whole = tmp_path / "whole.json"  # deeper than the parser can go: the file cannot be read, and says so
    whole.write_text("[" + nested_row(5000) + "]", encoding="utf-8")
    report, _ = check_data(DataConfig(train=[str(whole), str(listed)]))
    assert report.rows_kept == 1 and report.problems == [
        f"{whole} cannot be read: somewhere it nests objects and lists hundreds of levels deep (a row needs a few); "
        "convert it to JSONL, where such a row skips only itself"
    ]

    cells = tmp_path / "rows.csv"
    deep_list = "[" * 300 + "]" * 300
    cells.write_text(
        'messages\n"[{""role"": ""user"", ""content"": ""Hi""}, {""role"": ""assistant"", '
        '""content"": ""Yes""}]"\n"' + deep_list + '"\n',
        encoding="utf-8",
    )
    report, _ = check_data(DataConfig(train=[str(cells)]))
    assert (report.rows_kept, report.skipped) == (1, {"nested too deeply": 1})
    assert report.skipped_examples == [f"{cells}:3: messages: is a JSON list that cannot be used: {TOO_DEEP_WHY}"]


# Runs in a fresh process so its peak memory is these loads' alone; one process for both policies, since starting one
# (importing transformers) costs more than the loads. The peak is the process's VmHWM, reset to the current size
# before each load (ru_maxrss would not do: after fork and exec it starts at the parent's, pytest's, size).
_BIG_ROW_PROBE = textwrap.dedent("""
    import json, sys, time
    from transformers import AutoTokenizer
    from hone.core.config import DataConfig
    from hone.core.data import load_training_data

    def kb(field):
        return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(field + ":")))

    tokenizer_dir, data, cache = sys.argv[1:]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for overlong in ("drop", "truncate"):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to VmRSS
        rss = kb("VmRSS")
        start = time.monotonic()
        loaded = load_training_data(DataConfig(train=[data], max_length=256, overlong=overlong), tokenizer,
                                    cache_dir=f"{cache}-{overlong}")
        seconds = time.monotonic() - start
        report = loaded.reports[0]
        print(json.dumps({"overlong": overlong, "seconds": seconds, "extra_mb": (kb("VmHWM") - rss) / 1024,
                          "kept": report.rows_kept, "skipped": report.skipped, "examples": report.skipped_examples,
                          "truncated": report.truncated, "notes": report.notes,
                          "ids": [list(map(int, row.input_ids)) for row in loaded.train]}))
""")


@pytest.mark.slow
def test_a_50_mb_row_is_handled_in_seconds_without_tokenizing_it_whole(
    tmp_path, smollm2_tokenizer_dir, smollm2_tokenizer
):
    """Before: 434 s and a 6.4 GB peak (tokenizing 10 million tokens) to drop it. The row is checked by its length in
    characters first: with max_length 256, 256 x 32 = 8,192 characters are all a row can use."""
    big = "word " * 10_000_000  # 50,000,000 characters
    rows = [{"messages": [{"role": "user", "content": "Summarize"}, {"role": "assistant", "content": big}]}, GOOD]
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    probe = tmp_path / "probe.py"
    probe.write_text(_BIG_ROW_PROBE, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(probe), str(smollm2_tokenizer_dir), str(data), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    dropped, truncated = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    for result in (dropped, truncated):
        assert result["seconds"] < 10, result
        assert result["extra_mb"] < 1024, result

    rendered = smollm2_tokenizer.apply_chat_template(rows[0]["messages"], tokenize=False)
    small = list(smollm2_tokenizer.apply_chat_template(GOOD["messages"], tokenize=True)["input_ids"])
    assert (dropped["overlong"], dropped["kept"], dropped["skipped"]) == ("drop", 1, {"longer than max_length": 1})
    assert dropped["examples"] == [
        f"{data}:1: has {len(rendered):,} characters, far more than data.max_length = 256 tokens can hold (it would "
        "need over 32 characters per token), so it was not tokenized; shorten the row or set data.overlong = "
        '"truncate"'
    ]
    assert dropped["ids"] == [small]

    # Reference: the first 256 tokens of the rendered row, from a prefix long enough to hold them (the tokenizer
    # splits on spaces, so tokens before the cut do not depend on where it is).
    reference = smollm2_tokenizer(rendered[:4096], add_special_tokens=False)["input_ids"][:256]
    assert (truncated["kept"], truncated["skipped"], truncated["truncated"]) == (2, {}, 1)
    assert truncated["ids"] == [reference, small]
    assert (
        f"1 row had more than data.max_length x 32 characters; only that many were tokenized, then truncated "
        f"(kept): {data}:1" in truncated["notes"]
    )


def test_image_paths_outside_the_data_folder_are_kept_and_listed(tmp_path):
    from PIL import Image

    folder = tmp_path / "data"
    (folder / "pics").mkdir(parents=True)
    for path in (folder / "pics" / "in.png", tmp_path / "up.png", tmp_path / "abs.png"):
        Image.new("RGB", (20, 10), "red").save(path)
    (folder / "pics" / "link.png").symlink_to(tmp_path / "abs.png")

    def row(image):
        return {
            "messages": [
                {"role": "user", "content": [{"type": "image", "image": image}, "Color?"]},
                {"role": "assistant", "content": "Red."},
            ]
        }

    rows = [
        row("pics/in.png"),
        row("../up.png"),
        GOOD,
        row(str(tmp_path / "abs.png")),
        row("pics/../pics/in.png"),
        row("pics/link.png"),
    ]
    data = folder / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report, _ = check_data(DataConfig(train=[str(data)]))
    assert (report.rows_read, report.rows_kept, report.skipped) == (6, 6, {})
    assert (
        f"3 rows read an image from outside the data file's folder (kept): {data}:2, {data}:4, {data}:6" in report.notes
    )

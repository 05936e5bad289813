"""`hone init`: the starter config it prints loads and passes every check, carries RunConfig's defaults and help,
and maps a data file's columns so that the data loader keeps its rows. Run as users run it: a `hone` subprocess in
a temp dir, offline."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from hone.core.cli.commands.init import COMMON
from hone.core.config import SECTIONS, RunConfig

# No torch, no model: Python, rich and reading a few rows.
FAST_S = 6.0


def _hone(tmp_path, *argv: str):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HONE_CACHE": str(tmp_path / "cache")}
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "init", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    return out, time.monotonic() - start


def _load(tmp_path, text: str) -> RunConfig:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return RunConfig.load(path)  # every section's checks and RunConfig.check() run here


def _qa_csv(path, n: int):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "answer"])
        writer.writerows([f"What is {i} + {i}?", str(2 * i)] for i in range(n))
    return path


def test_csv_with_question_and_answer_gets_the_prompt_completion_mapping(tmp_path, monkeypatch):
    from hone.core.data import check_data

    _qa_csv(tmp_path / "qa.csv", 7)
    model = str(tmp_path / "my-model")  # a model folder as far as a config can tell; init reads no weights
    os.mkdir(model)
    (tmp_path / "my-model" / "config.json").write_text("{}", encoding="utf-8")
    out, took = _hone(tmp_path, "--model", model, "--data", "qa.csv")
    assert out.returncode == 0, out.stderr
    assert took < FAST_S
    config = _load(tmp_path, out.stdout)
    assert config.model.name_or_path == model and config.data.train == ["qa.csv"]
    assert config.data.columns == {"prompt": "question", "completion": "answer"}
    assert config.data.format == "prompt-completion"
    assert (
        '# qa.csv: detected prompt-completion, with columns = {prompt = "question", completion = "answer"}'
        in out.stdout
    )
    # The mapping goes the right way: the data loader keeps every row with it (none without it).
    monkeypatch.chdir(tmp_path)  # data.train is relative, as the user wrote it
    report, _ = check_data(config.data, None)
    assert (report.rows_read, report.rows_kept) == (7, 7)
    unmapped, _ = check_data(dataclasses.replace(config.data, columns={}, format="auto"), None)
    assert unmapped.rows_kept == 0


def test_without_options_it_is_runconfigs_defaults_with_one_comment_per_key(tmp_path):
    out, took = _hone(tmp_path)
    assert out.returncode == 0 and took < FAST_S, out.stderr
    assert _load(tmp_path, out.stdout) == RunConfig()
    lines = out.stdout.splitlines()
    written = {}
    section = None
    for k, line in enumerate(lines):
        if line.startswith("["):
            section = line[1 : line.index("]")]
        elif line and not line.startswith("#"):
            key = line.split(" = ", 1)[0]
            written.setdefault(section, []).append(key)
            assert lines[k - 1].startswith("# "), f"{section}.{key} has no comment line above it"
            help_text = dict((f.name, f.metadata["help"]) for f in dataclasses.fields(SECTIONS[section]))[key]
            assert lines[k - 1][2:].split(" (")[0].rstrip(".") in help_text  # the comment is the field's own help
    assert list(written) == list(SECTIONS)
    for section, keys in written.items():
        assert keys == list(COMMON[section]), section
        others = [f.name for f in dataclasses.fields(SECTIONS[section]) if f.name not in COMMON[section]]
        if others:
            assert f"# also: {', '.join(others)}" in lines


def test_every_common_key_is_a_config_field():
    for section, keys in COMMON.items():
        fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
        assert set(keys) <= fields, f"hone init names {sorted(set(keys) - fields)} in [{section}]: renamed?"


@pytest.mark.parametrize(
    "name, content, fmt, columns",
    [
        (
            "chats.jsonl",
            json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
            + "\n",
            "messages",
            {},
        ),
        (
            "dialogs.jsonl",
            json.dumps({"dialog": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n",
            "messages",
            {"messages": "dialog"},
        ),
        ("alpaca.json", json.dumps([{"instruction": "say hi", "output": "hi"}]), "alpaca", {}),
    ],
)
def test_detected_format_and_mapping(name, content, fmt, columns, tmp_path):
    (tmp_path / name).write_text(content, encoding="utf-8")
    out, _ = _hone(tmp_path, "--data", name)
    assert out.returncode == 0, out.stderr
    config = _load(tmp_path, out.stdout)
    assert (config.data.format, config.data.columns) == (fmt, columns)


def test_columns_it_cannot_map_are_said_and_the_config_still_loads(tmp_path):
    (tmp_path / "odd.csv").write_text("foo,bar\n1,2\n", encoding="utf-8")
    out, _ = _hone(tmp_path, "--data", "odd.csv")
    assert out.returncode == 0, out.stderr
    config = _load(tmp_path, out.stdout)
    assert (config.data.format, config.data.columns) == ("auto", {})
    note = "odd.csv: no known format in its columns (foo, bar): map yours in data.columns"
    assert f"# {note}" in out.stdout and f"hone: note: {note}" in out.stderr


def test_out_writes_the_file_and_never_replaces_one_without_force(tmp_path):
    out, _ = _hone(tmp_path, "--out", "run.toml")
    assert out.returncode == 0 and out.stdout == "" and "wrote run.toml" in out.stderr
    assert RunConfig.load(tmp_path / "run.toml") == RunConfig()
    (tmp_path / "run.toml").write_text("# mine\n", encoding="utf-8")
    out, _ = _hone(tmp_path, "--out", "run.toml")
    assert out.returncode == 2 and "run.toml already exists" in out.stderr and "--force" in out.stderr
    assert (tmp_path / "run.toml").read_text(encoding="utf-8") == "# mine\n"
    out, _ = _hone(tmp_path, "--out", "run.toml", "--force", "--model", "bundled:smollm2-135m-instruct")
    assert out.returncode == 0 and RunConfig.load(tmp_path / "run.toml") == RunConfig()


@pytest.mark.parametrize(
    "argv, message, advice",
    [
        (["--data", "nowhere.jsonl"], "nowhere.jsonl does not exist", "check the --data paths"),
        (["--model", "./no-such-model"], "no-such-model does not exist", "give --model"),
        (["--model", "bundled:smollm2"], "bundled:smollm2 is not a bundled model", "bundled:smollm2-135m-instruct"),
        (["--out", "."], "is a folder", "--out run.toml"),
    ],
)
def test_mistakes_exit_2_with_advice_and_print_nothing(argv, message, advice, tmp_path):
    out, took = _hone(tmp_path, *argv)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and took < FAST_S, out.stderr
    assert lines[0].startswith("hone: error: ") and message in lines[0]
    assert lines[1].startswith("hone: advice: ") and advice in lines[1]


def test_help(tmp_path):
    out, _ = _hone(tmp_path, "--help")
    assert out.returncode == 0
    for words in ("--model", "--data", "--out", "> run.toml", "exit codes"):
        assert words in out.stdout

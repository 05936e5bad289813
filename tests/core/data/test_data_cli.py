"""`hone data check` and `hone data inspect` through the real CLI entry point."""

from __future__ import annotations

import json
import re

import pytest
from data_helpers import chat, write_jsonl

from hone.core.cli import dispatch as cli


@pytest.fixture
def hone(monkeypatch, capsys):
    """Run `hone ...` in-process (only the data command is registered, so other commands' state does not
    matter) and return (exit code, stdout, stderr)."""
    monkeypatch.setattr(cli, "COMMANDS", {"data": cli.COMMANDS["data"]})

    def run(*argv):
        code = cli.main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_check_without_model_prints_the_table(tmp_path, hone):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a"), {"messages": []}, chat("q2", "a2")])
    code, out, _ = hone("data", "check", path)
    assert code == 0
    for line in (r"rows read\s+3\n", r"rows kept\s+2\n", r"rows skipped\s+1\n", r"empty conversation\s+1\n"):
        assert re.search(line, out), (line, out)
    assert f"{path}:2: messages: is an empty list" in out


def test_check_with_model_counts_tokens_and_json(tmp_path, hone, smollm2_tokenizer_dir, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")])
    code, out, _ = hone("data", "check", path, "--model", smollm2_tokenizer_dir, "--json")
    report = json.loads(out)
    expected = len(smollm2_tokenizer.apply_chat_template(chat("q", "a")["messages"], tokenize=True)["input_ids"])
    assert code == 0 and report["event"] == "DatasetReport" and report["tokens"] == expected


def test_check_exits_1_when_no_row_is_usable(tmp_path, hone):
    path = write_jsonl(tmp_path / "a.jsonl", [{"messages": []}])
    code, _, err = hone("data", "check", path)
    assert code == 1 and "no usable row" in err


def test_inspect_prints_trained_text(tmp_path, hone, smollm2_tokenizer_dir):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "first"), chat("q", "second")])
    code, out, _ = hone("data", "inspect", path, "--model", smollm2_tokenizer_dir, "--row", "1-2", "--no-color")
    assert code == 0 and "[[first<|im_end|>]]" in out and "[[second<|im_end|>]]" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--row", "x"], ["--row 'x'"]),
        (["--row", "0"], ["numbered from 1"]),
        (["--row", "9"], ["has no row 9"]),
        (["--column", "nonsense"], ["NAME=YOURS"]),
    ],
)
def test_inspect_mistakes_are_one_line_errors(tmp_path, hone, smollm2_tokenizer_dir, argv, words):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")])
    code, _, err = hone("data", "inspect", path, "--model", smollm2_tokenizer_dir, *argv)
    assert code == 2 and all(w in err for w in words), err


def test_unknown_model_is_a_model_error(tmp_path, hone):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")])
    code, _, err = hone("data", "check", path, "--model", tmp_path / "no-such-model")
    assert code == 2 and "no-such-model does not exist" in err


def test_model_folder_gives_the_training_tokenizer(tmp_path, hone, tiny_model_dir, smollm2_tokenizer):
    """A real model folder (config.json + weights + tokenizer) is read the way training reads it."""
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")])
    code, out, _ = hone("data", "check", path, "--model", tiny_model_dir("tiny-dense"), "--json")
    expected = len(smollm2_tokenizer.apply_chat_template(chat("q", "a")["messages"], tokenize=True)["input_ids"])
    assert code == 0 and json.loads(out)["tokens"] == expected

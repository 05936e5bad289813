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


def test_inspect_a_pair_shows_the_prompt_once_and_both_answers_scored(tmp_path, hone, smollm2_tokenizer_dir):
    rows = [
        {"prompt": "What is 2+2?", "chosen": "It is 4.", "rejected": "Maybe 5."},
        {"prompt": "Say hi", "chosen": "hi", "rejected": ""},
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    code, out, _ = hone(
        "data", "inspect", path, "--model", smollm2_tokenizer_dir, "--method", "dpo", "--row", "1-2", "--no-color"
    )
    assert code == 0, out
    first, second = out.split("-" * 60)
    assert first.count("What is 2+2?") == 1, "the prompt is shown once"
    assert re.search(r"── chosen \(\d+ tokens, \d+ scored\)\n.*\[\[It is 4\.", first)
    assert re.search(r"── rejected \(\d+ tokens, \d+ scored\)\n.*\[\[Maybe 5\.", first)
    assert re.search(rf"{re.escape(str(path))}:1: [^,]+, 2 answers, \d+ tokens, \d+ scored", first)
    assert second.strip().startswith(f"skipped: {path}:2: ") and "rejected" in second


def test_inspect_kto_rows_shows_each_answer_under_its_label(tmp_path, hone, smollm2_tokenizer_dir):
    rows = [{"prompt": "Capital of France?", "completion": "Paris.", "label": True}]
    path = write_jsonl(tmp_path / "kto.jsonl", rows)
    code, out, _ = hone("data", "inspect", path, "--model", smollm2_tokenizer_dir, "--method", "kto", "--no-color")
    assert code == 0, out
    assert re.search(r"── desirable \(\d+ tokens, \d+ scored\)\n.*\[\[Paris\.", out)
    assert ", 1 answer, " in out


def test_inspect_grpo_prompts_shows_the_rendered_prompt_and_the_reward_columns(tmp_path, hone, smollm2_tokenizer_dir):
    rows = [{"prompt": "Add 2 and 3.", "answer": "5", "meta": {"level": 1}}, {"prompt": "   "}]
    path = write_jsonl(tmp_path / "prompts.jsonl", rows)
    code, out, _ = hone(
        "data", "inspect", path, "--model", smollm2_tokenizer_dir, "--method", "grpo", "--row", "1-2", "--tokens",
        "--no-color",
    )  # fmt: skip
    assert code == 0, out
    first, second = out.split("-" * 60)
    assert "Add 2 and 3." in first and "<|im_start|>assistant" in first, "rendered with the assistant's turn opened"
    assert re.search(rf"{re.escape(str(path))}:1: prompt, \d+ tokens", first)
    assert "  answer: 5\n" in first and "  meta: {'level': 1}" in first and "  prompt:" not in first
    assert re.search(r"  tokens: \d+( \d+)+", first)
    assert second.strip().startswith(f"skipped: {path}:2: ")

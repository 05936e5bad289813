"""Every row format and the column mapping: each row tokenizes exactly as the equivalent chat messages do
through transformers' own apply_chat_template (the reference)."""

from __future__ import annotations

import json

import pytest
from data_helpers import write_jsonl

from hone.core.config import DataConfig
from hone.core.data import load_training_data
from hone.core.data.formats import ColumnNames, detect_format

Q, A = "Name a prime number.", "Seven."
EXPECTED = [{"role": "user", "content": Q}, {"role": "assistant", "content": A}]
WITH_SYSTEM = [{"role": "system", "content": "Be brief."}, *EXPECTED]

CASES = [
    ("messages", {"messages": EXPECTED}, {}, EXPECTED),
    (
        "messages with text parts",
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Name a "}, "prime number."]},
                {"role": "assistant", "content": [{"type": "text", "text": A}]},
            ]
        },
        {},
        EXPECTED,
    ),
    (
        "sharegpt",
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": Q},
                {"from": "gpt", "value": A},
            ]
        },
        {},
        WITH_SYSTEM,
    ),
    (
        "sharegpt with system column",
        {"system": "Be brief.", "conversations": [{"from": "human", "value": Q}, {"from": "gpt", "value": A}]},
        {},
        WITH_SYSTEM,
    ),
    ("alpaca without input", {"instruction": Q, "input": "", "output": A}, {}, EXPECTED),
    (
        "alpaca with input",
        {"instruction": "Name a", "input": "prime number.", "output": A},
        {},
        [{"role": "user", "content": "Name a\n\nprime number."}, EXPECTED[1]],
    ),
    ("alpaca with system", {"instruction": Q, "output": A, "system": "Be brief."}, {}, WITH_SYSTEM),
    ("prompt-completion", {"prompt": Q, "completion": A}, {}, EXPECTED),
    (
        "prompt-completion as messages",
        {"prompt": [{"role": "user", "content": Q}], "completion": [{"role": "assistant", "content": A}]},
        {},
        EXPECTED,
    ),
    (
        "mapped messages and turn keys",
        {"dialog": [{"speaker": "user", "utterance": Q}, {"speaker": "assistant", "utterance": A}]},
        {"messages": "dialog", "role": "speaker", "content": "utterance"},
        EXPECTED,
    ),
    ("mapped alpaca", {"q": Q, "a": A}, {"instruction": "q", "output": "a"}, EXPECTED),
    ("role aliases", {"messages": [{"role": "Human", "content": Q}, {"role": "model", "content": A}]}, {}, EXPECTED),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_format_renders_like_the_equivalent_messages(tmp_path, smollm2_tokenizer, case):
    _, row, columns, expected = case
    path = write_jsonl(tmp_path / "a.jsonl", [row])
    data = load_training_data(DataConfig(train=[str(path)], columns=columns), smollm2_tokenizer)
    reference = smollm2_tokenizer.apply_chat_template(expected, tokenize=True)["input_ids"]
    assert data.train[0].input_ids == list(reference)
    trained = [t for t, label in zip(data.train[0].input_ids, data.train[0].labels, strict=True) if label != -100]
    assert smollm2_tokenizer.decode(trained) == A + "<|im_end|>"


def test_text_rows_train_every_token_and_end_with_eos(tmp_path, smollm2_tokenizer):
    texts = ["Hone packs rows.", "Second document, a little longer than the first one."]
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    data = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer)
    assert data.reports[0].format == "text"
    for text, row in zip(texts, data.train, strict=True):
        expected = smollm2_tokenizer(text)["input_ids"] + [smollm2_tokenizer.eos_token_id]
        assert row.input_ids == expected and row.labels == expected


def test_format_override_beats_detection(tmp_path, smollm2_tokenizer):
    row = {"messages": EXPECTED, "text": "raw document"}
    path = write_jsonl(tmp_path / "a.jsonl", [row])
    auto = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer)
    forced = load_training_data(DataConfig(train=[str(path)], format="text"), smollm2_tokenizer)
    assert auto.reports[0].format == "messages" and forced.reports[0].format == "text"
    assert forced.train[0].input_ids[:-1] == smollm2_tokenizer("raw document")["input_ids"]


def test_files_of_different_formats_mix_in_one_split(tmp_path, smollm2_tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", [{"messages": EXPECTED}] * 2)
    b = write_jsonl(tmp_path / "b.jsonl", [{"instruction": Q, "output": A}])
    data = load_training_data(DataConfig(train=[str(a), str(b)]), smollm2_tokenizer)
    assert data.reports[0].format == "messages (2), alpaca (1)"
    assert data.train[0].input_ids == data.train[2].input_ids


def test_tool_turns_and_tool_calls_reach_the_template(tmp_path, smollm2_tokenizer):
    source = (
        "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}{% if m.tool_calls %}"
        "{{ m.tool_calls | tojson }}{% endif %}|{% endfor %}"
    )
    smollm2_tokenizer_copy = type(smollm2_tokenizer).from_pretrained(smollm2_tokenizer.name_or_path)
    smollm2_tokenizer_copy.chat_template = source
    calls = [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]
    row = {
        "messages": [
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "content": "1"},
            {"role": "assistant", "content": "It is 1."},
        ]
    }
    path = write_jsonl(tmp_path / "a.jsonl", [row])
    data = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer_copy)
    text = smollm2_tokenizer_copy.decode(data.train[0].input_ids)
    assert text == f"user:add|assistant:{json.dumps(calls)}|tool:1|assistant:It is 1.|"


def test_detection_order_and_message():
    columns = ColumnNames({})
    assert detect_format({"messages": [], "text": ""}, columns) == "messages"
    assert detect_format({"instruction": "", "output": "", "text": ""}, columns) == "alpaca"
    assert detect_format({"prompt": "", "completion": ""}, columns) == "prompt-completion"
    assert detect_format({"dialog": []}, ColumnNames({"messages": "dialog"})) == "messages"

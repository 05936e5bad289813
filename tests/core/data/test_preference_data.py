"""Preference rows read, checked and tokenized as pairs: each answer scored after its prompt, bad rows named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hone.core.config import DataConfig
from hone.core.data.preference import (
    IDENTICAL_ANSWERS,
    PROMPT_TOO_LONG,
    PairSet,
    check_pairs,
    load_preference_data,
)
from hone.core.data.text_only import IMAGE_IN_TEXT_ONLY_ROW
from hone.core.errors import DataError

pytestmark = pytest.mark.core


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _answers(pairs: PairSet, tokenizer, k: int = 0) -> tuple[str, str, str]:
    """(shared prompt text, chosen answer text, rejected answer text) of pair k, from its scored tokens."""
    chosen, rejected = pairs[k].sequences
    scored = [
        tokenizer.decode([t for t, label in zip(s.input_ids, s.labels, strict=True) if label != -100])
        for s in (chosen, rejected)
    ]
    prompt_len = chosen.labels.index(next(label for label in chosen.labels if label != -100))
    assert chosen.input_ids[:prompt_len] == rejected.input_ids[:prompt_len]  # the same prompt before each answer
    return tokenizer.decode(chosen.input_ids[:prompt_len]), scored[0], scored[1]


def test_plain_text_pairs_score_each_answer_and_its_end_of_text(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}])
    data = load_preference_data(DataConfig(train=[path]), smollm2_tokenizer)
    prompt, chosen, rejected = _answers(data.train, smollm2_tokenizer)
    eos = smollm2_tokenizer.eos_token
    assert prompt.endswith("The sky is") and (chosen, rejected) == (f" blue.{eos}", f" green.{eos}")
    assert data.reports[0].rows_kept == 1 and data.reports[0].format == "preference (text)"


def test_conversational_pairs_render_through_the_chat_template(tmp_path, smollm2_tokenizer):
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5, I think"}],
        }
    ]
    data = load_preference_data(DataConfig(train=[_write(tmp_path / "m.jsonl", rows)]), smollm2_tokenizer)
    prompt, chosen, rejected = _answers(data.train, smollm2_tokenizer)
    whole = smollm2_tokenizer.apply_chat_template(rows[0]["prompt"] + rows[0]["chosen"], tokenize=False)
    assert whole.startswith(prompt) and prompt.endswith("<|im_start|>assistant\n")
    assert (chosen, rejected) == ("4<|im_end|>", "5, I think<|im_end|>")


def test_the_prompt_is_found_where_the_answers_share_it(tmp_path, smollm2_tokenizer):
    user = {"role": "user", "content": "Name a colour."}
    rows = [
        {  # UltraFeedback-binarized: a prompt string beside answers that repeat it as their first turn
            "prompt": "Name a colour.",
            "chosen": [user, {"role": "assistant", "content": "Red."}],
            "rejected": [user, {"role": "assistant", "content": "Seven."}],
        },
        {  # HH-RLHF: one text per answer, the dialogue before the last assistant turn shared
            "chosen": "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?",
            "rejected": "\n\nHuman: Hi there\n\nAssistant: Go away.",
        },
    ]
    data = load_preference_data(DataConfig(train=[_write(tmp_path / "s.jsonl", rows)]), smollm2_tokenizer)
    assert len(data.train) == 2
    prompt, chosen, _ = _answers(data.train, smollm2_tokenizer, 0)
    assert "Name a colour." in prompt and chosen == "Red.<|im_end|>"
    prompt, chosen, rejected = _answers(data.train, smollm2_tokenizer, 1)
    eos = smollm2_tokenizer.eos_token
    assert prompt.endswith("Assistant:") and (chosen, rejected) == (f" Hello! How can I help?{eos}", f" Go away.{eos}")


IMAGE_PART = {"type": "image", "image": "cat.png"}
BAD_ROWS = [
    ({"prompt": "Q", "chosen": "same", "rejected": "same"}, IDENTICAL_ANSWERS, "rejected"),
    # images are not trained by the preference methods: said, never dropped silently
    ({"prompt": "Q", "chosen": "yes", "rejected": "no", "images": ["cat.png"]}, IMAGE_IN_TEXT_ONLY_ROW, "images"),
    (
        {
            "prompt": [{"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "What is it?"}]}],
            "chosen": [{"role": "assistant", "content": "A cat."}],
            "rejected": [{"role": "assistant", "content": "A dog."}],
        },
        IMAGE_IN_TEXT_ONLY_ROW,
        "prompt[0].content[0]",
    ),
    ({"prompt": "Q", "chosen": "   ", "rejected": "no"}, "empty content", "chosen"),
    ({"prompt": "Q", "chosen": "yes"}, "missing field", "rejected"),
    ({"prompt": "Q", "chosen": 5, "rejected": "no"}, "wrong type", "chosen"),
    ({"prompt": "Q", "chosen": "yes", "rejected": [{"role": "assistant", "content": "no"}]}, "wrong type", "rejected"),
    ({"chosen": "abc", "rejected": "xyz"}, "missing field", "prompt"),
    (
        {
            "prompt": [{"role": "user", "content": "Q"}],
            "chosen": [{"role": "user", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}],
        },
        "empty content",
        "chosen",
    ),
]


def test_every_bad_row_is_skipped_naming_its_row_and_field(tmp_path):
    good = {"prompt": "Q", "chosen": "yes", "rejected": "no"}
    path = _write(tmp_path / "bad.jsonl", [good] + [row for row, _, _ in BAD_ROWS])
    report = check_pairs(DataConfig(train=[path]))
    assert (report.rows_read, report.rows_kept) == (1 + len(BAD_ROWS), 1)
    for line, (_, _, field) in enumerate(BAD_ROWS, start=2):
        example = next(e for e in report.skipped_examples if e.startswith(f"{path}:{line}:"))
        assert f": {field}" in example, example
    assert sum(report.skipped.values()) == len(BAD_ROWS)
    assert {reason for _, reason, _ in BAD_ROWS} <= set(report.skipped)


def test_a_prompt_that_fills_max_length_skips_the_pair_and_no_pair_left_is_an_error(tmp_path, smollm2_tokenizer):
    long_prompt = "word " * 300
    path = _write(tmp_path / "long.jsonl", [{"prompt": long_prompt, "chosen": " a", "rejected": " b"}])
    cfg = DataConfig(train=[path], max_length=64)
    report = check_pairs(cfg, smollm2_tokenizer)
    assert report.skipped == {PROMPT_TOO_LONG: 1} and "data.max_length = 64" in report.skipped_examples[0]
    with pytest.raises(DataError) as error:
        load_preference_data(cfg, smollm2_tokenizer)
    assert "no usable training pairs" in error.value.message and PROMPT_TOO_LONG in error.value.message


def test_eval_fraction_holds_out_whole_pairs(tmp_path, smollm2_tokenizer):
    rows = [{"prompt": f"Q{i}", "chosen": f" right {i}", "rejected": f" wrong {i}"} for i in range(10)]
    data = load_preference_data(
        DataConfig(train=[_write(tmp_path / "p.jsonl", rows)], eval_fraction=0.2), smollm2_tokenizer, seed=4
    )
    assert (len(data.train), len(data.eval)) == (8, 2)
    sources = {data.train.source(i) for i in range(8)} | {data.eval.source(i) for i in range(2)}
    assert len(sources) == 10  # no pair on both sides, none lost
    assert np.array_equal(
        data.train.lengths, [len(data.train[i].input_ids) for i in range(8)]
    ) and data.train.num_trained == int(data.train.trained_lengths.sum())

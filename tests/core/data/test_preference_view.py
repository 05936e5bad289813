"""The preference inspector shows each answer tokenized exactly as training tokenizes it (the same ids and scored
tokens as the loaded training data), the prompt cut off where the answer starts, and skipped rows with the report's
reason; the Data page's check of preference data returns the rows training would read."""

from __future__ import annotations

import json

import pytest

from hone.core.config import DataConfig
from hone.core.data.preference import load_preference_data
from hone.core.data.preference_view import check_preference, inspect_preference_rows
from hone.core.data.unpaired import load_unpaired_data

pytestmark = pytest.mark.core

PAIRS = [
    {"prompt": "The sky is", "chosen": " blue on a clear day.", "rejected": " green."},
    {
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "chosen": [{"role": "assistant", "content": "2 + 2 is 4."}],
        "rejected": [{"role": "assistant", "content": "5"}],
    },
    {"prompt": "Same", "chosen": " answer", "rejected": " answer"},
]
UNPAIRED = [
    {"prompt": "The sky is", "completion": " blue.", "label": True},
    {
        "prompt": [{"role": "user", "content": "Name a colour."}],
        "completion": [{"role": "assistant", "content": "Seven."}],
        "label": False,
    },
    {"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"},
]


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _as_trained(sequence) -> tuple[list[int], list[bool]]:
    return list(sequence.input_ids), [label != -100 for label in sequence.labels]


def test_pair_answers_have_the_tokens_and_scored_tokens_training_uses(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "pairs.jsonl", PAIRS)
    cfg = DataConfig(train=[path])
    training = load_preference_data(cfg, smollm2_tokenizer).train  # the first two rows; the third is skipped
    views = inspect_preference_rows(path, smollm2_tokenizer, [1, 2, 3], cfg=cfg, method="dpo")
    for k, view in enumerate(views[:2]):
        assert view.problem is None and [a.side for a in view.answers] == ["chosen", "rejected"]
        for answer, sequence in zip(view.answers, training[k].sequences, strict=True):
            assert (answer.token_ids, answer.trained) == _as_trained(sequence)
            # the prompt pieces are the unscored tokens before the answer; the answer's text is the rest of the render
            assert answer.prompt_tokens == sequence.labels.index(next(x for x in sequence.labels if x != -100))
            assert not any(p.trained for p in answer.prompt) and any(p.trained for p in answer.answer)
            assert sum(p.tokens for p in answer.prompt + answer.answer) == answer.num_tokens
        chosen, rejected = view.answers
        assert chosen.prompt_text == rejected.prompt_text == view.prompt_text
        assert view.num_tokens == len(training[k].input_ids)
        assert view.num_trained == sum(label != -100 for label in training[k].labels)
    text = views[0].answers
    assert text[0].prompt_text.endswith("The sky is") and text[0].answer_text.startswith(" blue on a clear day.")
    assert text[1].answer_text.startswith(" green.")
    assert "What is 2 + 2?" in views[1].prompt_text and views[1].answers[1].answer_text.startswith("5")
    assert views[2].answers == [] and views[2].problem.startswith(f"{path}:3: rejected: ")
    assert "nothing to prefer" in views[2].problem


def test_kto_answers_carry_their_label_and_a_paired_row_gives_both(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "kto.jsonl", UNPAIRED)
    cfg = DataConfig(train=[path])
    training = load_unpaired_data(cfg, smollm2_tokenizer).train  # 4 answers: rows 1, 2 and both of row 3
    views = inspect_preference_rows(path, smollm2_tokenizer, [1, 2, 3], cfg=cfg, method="kto")
    answers = [a for v in views for a in v.answers]
    assert [a.side for a in answers] == ["desirable", "undesirable", "desirable", "undesirable"]
    assert [bool(d) for d in training.desirable] == [True, False, True, False]
    for answer, k in zip(answers, range(4), strict=True):
        assert (answer.token_ids, answer.trained) == _as_trained(training[k])
    assert answers[2].prompt_text == answers[3].prompt_text and answers[3].answer_text.startswith(" 5")


def test_a_prompt_that_fills_max_length_is_shown_as_training_skips_it(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "long.jsonl", [{"prompt": "word " * 300, "chosen": " yes", "rejected": " no"}])
    (view,) = inspect_preference_rows(path, smollm2_tokenizer, [1], cfg=DataConfig(max_length=64), method="dpo")
    assert view.answers == [] and "raise data.max_length or shorten the prompt" in view.problem


def test_the_check_returns_the_rows_training_reads(tmp_path, smollm2_tokenizer):
    pairs = _write(tmp_path / "pairs.jsonl", PAIRS)
    report, rows = check_preference(DataConfig(train=[pairs]), smollm2_tokenizer, method="dpo")
    assert (report.rows_read, report.rows_kept, len(rows)) == (3, 2, 2)
    assert [rows.source(k) for k in range(2)] == [f"{pairs}:1", f"{pairs}:2"]
    assert report.tokens == int(rows.lengths.sum()) and len(rows.sequences.lengths) == 4
    kto = _write(tmp_path / "kto.jsonl", UNPAIRED)
    report, rows = check_preference(DataConfig(train=[kto]), smollm2_tokenizer, method="kto")
    assert (report.rows_read, len(rows), rows.desirable.tolist()) == (3, 4, [True, False, True, False])
    report, rows = check_preference(DataConfig(train=[kto]), None, method="kto")
    assert rows is None and report.rows_kept == 4

"""KTO rows read, checked and tokenized: each answer scored after its prompt with its label, bad rows named by file,
row and field, paired rows unpaired, unbalanced labels noted with the weight to set, and `hone data check --method
kto` reporting them."""

from __future__ import annotations

import json

import pytest

from hone.core.config import DataConfig
from hone.core.data.collate import collate_packed
from hone.core.data.preference import PROMPT_TOO_LONG
from hone.core.data.rows import EMPTY_CONTENT, MISSING_FIELD, WRONG_TYPE
from hone.core.data.text_only import IMAGE_IN_TEXT_ONLY_ROW
from hone.core.data.unpaired import balance_note, check_unpaired, load_unpaired_data
from hone.core.errors import DataError

pytestmark = pytest.mark.core


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _scored(row, tokenizer) -> tuple[str, str]:
    """(prompt text, scored answer text) of a tokenized row."""
    first = next(i for i, label in enumerate(row.labels) if label != -100)
    scored = [t for t, label in zip(row.input_ids, row.labels, strict=True) if label != -100]
    return tokenizer.decode(row.input_ids[:first]), tokenizer.decode(scored)


def test_text_and_message_rows_score_their_answer_and_carry_their_label(tmp_path, smollm2_tokenizer):
    rows = [
        {"prompt": "The sky is", "completion": " blue.", "label": True},
        {
            "prompt": [{"role": "user", "content": "2+2?"}],
            "completion": [{"role": "assistant", "content": "5, I think"}],
            "label": False,
        },
    ]
    data = load_unpaired_data(DataConfig(train=[_write(tmp_path / "k.jsonl", rows)]), smollm2_tokenizer)
    eos = smollm2_tokenizer.eos_token
    prompt, answer = _scored(data.train[0], smollm2_tokenizer)
    assert prompt.endswith("The sky is") and answer == f" blue.{eos}"
    prompt, answer = _scored(data.train[1], smollm2_tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n") and answer.startswith("5, I think")
    assert data.train.desirable.tolist() == [True, False]
    assert [data.train[i].desirable for i in range(2)] == [True, False]
    assert collate_packed([data.train[1], data.train[0]]).desirable.tolist() == [False, True]  # the batch has them
    assert data.reports[0].rows_kept == 2 and set(data.reports[0].format.split(", ")) == {
        "unpaired (text) (1)",
        "unpaired (messages) (1)",
    }


def test_a_paired_row_gives_its_chosen_answer_desirable_and_its_rejected_one_not(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "Q:", "chosen": " yes", "rejected": " no"}])
    data = load_unpaired_data(DataConfig(train=[path]), smollm2_tokenizer)
    assert len(data.train) == 2 and data.train.desirable.tolist() == [True, False]
    eos = smollm2_tokenizer.eos_token
    assert [_scored(data.train[i], smollm2_tokenizer)[1] for i in range(2)] == [f" yes{eos}", f" no{eos}"]


USER, EMPTY_ANSWER = {"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}
ANSWER = {"role": "assistant", "content": "A"}
BAD_ROWS = [  # (row, reason, field named)
    ({"prompt": "Q", "completion": "A"}, MISSING_FIELD, "label"),
    ({"prompt": "Q", "completion": "A", "label": "yes"}, WRONG_TYPE, "label"),
    ({"prompt": "Q", "completion": "A", "label": 1}, WRONG_TYPE, "label"),
    ({"prompt": "Q", "completion": "  ", "label": True}, EMPTY_CONTENT, "completion"),
    ({"prompt": [USER], "completion": [EMPTY_ANSWER], "label": True}, EMPTY_CONTENT, "completion"),
    ({"prompt": "Q", "label": True}, MISSING_FIELD, "completion"),
    ({"completion": "A", "label": True}, MISSING_FIELD, "prompt"),
    ({"prompt": [USER], "completion": "A", "label": True}, WRONG_TYPE, "prompt"),
    ({"prompt": "Q", "completion": 3, "label": False}, WRONG_TYPE, "completion"),
    ({"prompt": "Q", "completion": "A", "label": True, "images": ["cat.png"]}, IMAGE_IN_TEXT_ONLY_ROW, "images"),
    (
        {
            "prompt": [{"role": "user", "content": [{"type": "image", "image": "cat.png"}]}],
            "completion": [ANSWER],
            "label": False,
        },
        IMAGE_IN_TEXT_ONLY_ROW,
        "prompt[0].content[0]",
    ),
]


def test_every_bad_row_is_skipped_naming_its_file_row_and_field(tmp_path):
    good = {"prompt": "Q", "completion": "A", "label": True}
    path = _write(tmp_path / "bad.jsonl", [good] + [row for row, _, _ in BAD_ROWS])
    report = check_unpaired(DataConfig(train=[path]))
    assert (report.rows_read, report.rows_kept) == (1 + len(BAD_ROWS), 1)
    for line, (_, reason, field) in enumerate(BAD_ROWS, start=2):
        example = next(e for e in report.skipped_examples if e.startswith(f"{path}:{line}:"))
        assert f": {field}" in example, (example, reason)
    assert report.skipped == {MISSING_FIELD: 3, WRONG_TYPE: 4, EMPTY_CONTENT: 2, IMAGE_IN_TEXT_ONLY_ROW: 2}


def test_a_prompt_longer_than_max_length_skips_the_row_and_no_row_left_is_an_error(tmp_path, smollm2_tokenizer):
    path = _write(tmp_path / "long.jsonl", [{"prompt": "word " * 300, "completion": " a", "label": True}])
    cfg = DataConfig(train=[path], max_length=64)
    report = check_unpaired(cfg, smollm2_tokenizer)
    assert report.skipped == {PROMPT_TOO_LONG: 1}
    assert (
        report.skipped_examples[0].startswith(f"{path}:1: prompt: ")
        and "data.max_length = 64" in (report.skipped_examples[0])
    )
    with pytest.raises(DataError) as error:
        load_unpaired_data(cfg, smollm2_tokenizer)
    assert "no usable training rows for KTO" in error.value.message and "label" in error.value.advice


@pytest.mark.parametrize(
    "desirable, undesirable, weights, says",
    [
        (50, 50, (1.0, 1.0), None),
        (60, 50, (1.0, 1.0), None),  # 1.2: inside [1, 4/3]
        (20, 80, (1.0, 1.0), "set preference.desirable_weight between 4.00 and 5.33"),
        (90, 10, (1.0, 1.0), "set preference.undesirable_weight between 6.75 and 9.00"),
        (20, 80, (4.5, 1.0), None),  # weighted into the range
        (5, 95, (20.0, 1.0), "5% the fewer): the weights balance them, but few desirable rows"),  # too few to trust
        (30, 0, (1.0, 1.0), "all 30 rows are labelled desirable"),
    ],
)
def test_unbalanced_labels_get_a_note_naming_the_weight_to_set(desirable, undesirable, weights, says):
    note = balance_note(desirable, undesirable, weights)
    assert note is None if says is None else says in note


def test_the_data_report_and_hone_data_check_method_kto_note_unbalanced_labels(tmp_path, smollm2_tokenizer, capsys):
    from hone.core.cli import main

    rows = [{"prompt": f"Q{i}", "completion": f" A{i}", "label": i < 2} for i in range(20)]
    path = _write(tmp_path / "k.jsonl", rows)
    data = load_unpaired_data(DataConfig(train=[path], eval_fraction=0.0), smollm2_tokenizer)
    assert any("preference.desirable_weight between 9.00 and 12.00" in n for n in data.reports[0].notes)
    assert main(["data", "check", path, "--method", "kto", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows_kept"] == 20 and any("desirable_weight" in n for n in report["notes"])
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "Q", "completion": "A"}])
    assert main(["data", "check", bad, "--method", "kto"]) == 1
    assert f"{bad}:1: label: is missing" in capsys.readouterr().out

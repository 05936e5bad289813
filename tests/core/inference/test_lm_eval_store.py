"""RUN_DIR/lm_eval_scores.json: lm-eval task scores stored, replaced only for the same model, weights, task, limit,
shots, chat template and system instruction, read back as written (an entry from before the chat template was recorded
as raw text), and a damaged file named and rewritten from what could be read. No lm-eval needed."""

from __future__ import annotations

import json

from hone.core.inference.harness.run import task_entries
from hone.core.inference.harness.store import TaskScore, read_task_scores, store_task_scores


def _score(model="base", task="gsm8k", limit=200, shots=5, value=0.25, chat=False, system=None) -> TaskScore:
    return TaskScore(
        model=model,
        weights="base:tiny" if model == "base" else "adapter:abc",
        task=task,
        limit=limit,
        num_fewshot=shots,
        samples=limit or 1319,
        metrics={"exact_match,strict-match": value, "exact_match,flexible-extract": None},
        stderr={"exact_match,strict-match": 0.03},
        task_version="3.0",
        lm_eval="0.4.13",
        scored="2026-12-05T14:03:11Z",
        chat_template=chat,
        system_instruction=system,
    )


def test_scores_are_replaced_only_for_the_same_settings(tmp_path):
    first = [_score(), _score("tuned"), _score(limit=None)]
    path = store_task_scores(tmp_path, first)
    again = _score(value=0.5)  # the base on gsm8k, 200 rows, 5 shots: replaces the first entry
    other = _score(shots=0)  # other shots: kept beside
    store_task_scores(tmp_path, [again, other])
    stored = read_task_scores(tmp_path)
    assert stored.damage == "" and stored.path == path
    assert stored.entries == [first[1], first[2], again, other]
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["hone_lm_eval_scores"] == 1 and raw["entries"][2]["metrics"]["exact_match,strict-match"] == 0.5
    assert raw["entries"][0]["metrics"]["exact_match,flexible-extract"] is None


def test_the_chat_template_and_system_instruction_are_settings_of_their_own(tmp_path):
    raw, chat, told = _score(), _score(chat=True, value=0.4), _score(chat=True, system="Be brief.", value=0.45)
    path = store_task_scores(tmp_path, [raw, chat, told])
    assert read_task_scores(tmp_path).entries == [raw, chat, told]  # the same task, limit and shots: three settings
    again = _score(chat=True, value=0.5)  # through the template, no system instruction: replaces `chat` alone
    store_task_scores(tmp_path, [again])
    assert read_task_scores(tmp_path).entries == [raw, told, again]
    written = json.loads(path.read_text(encoding="utf-8"))["entries"]
    assert [(e["chat_template"], e["system_instruction"]) for e in written] == [(False, None), (True, "Be brief."),
                                                                                (True, None)]  # fmt: skip


def test_an_entry_from_before_the_chat_template_was_recorded_reads_as_raw_text(tmp_path):
    older = _score().as_dict()
    del older["chat_template"], older["system_instruction"]
    (tmp_path / "lm_eval_scores.json").write_text(
        json.dumps({"hone_lm_eval_scores": 1, "entries": [older]}), encoding="utf-8"
    )
    stored = read_task_scores(tmp_path)
    assert stored.damage == "" and stored.entries == [_score()]  # chat_template False, no system instruction
    store_task_scores(tmp_path, [_score(chat=True, value=0.5)])  # another setting: the older entry stays
    assert read_task_scores(tmp_path).entries == [_score(), _score(chat=True, value=0.5)]
    store_task_scores(tmp_path, [_score(value=0.75)])  # raw text again: replaces it
    assert read_task_scores(tmp_path).entries == [_score(chat=True, value=0.5), _score(value=0.75)]


def test_a_damaged_file_is_named_and_its_readable_entries_kept(tmp_path):
    good = _score().as_dict()
    bad = {**_score("tuned").as_dict(), "samples": -1, "metrics": {"acc,none": "high"}}
    (tmp_path / "lm_eval_scores.json").write_text(json.dumps({"entries": [good, bad, "x"]}), encoding="utf-8")
    stored = read_task_scores(tmp_path)
    assert [e.as_dict() for e in stored.entries] == [good]
    assert "lm_eval_scores.json is damaged" in stored.damage
    assert "entries[1].samples is -1, below 0" in stored.damage and "not a number at 'acc,none'" in stored.damage
    assert "entries[2] is 'x', not an object" in stored.damage
    store_task_scores(tmp_path, [_score("tuned")])  # writes the file afresh: what was readable and the new one
    assert read_task_scores(tmp_path).damage == "" and len(read_task_scores(tmp_path).entries) == 2
    (tmp_path / "lm_eval_scores.json").write_text("{half", encoding="utf-8")
    assert "is not valid JSON" in read_task_scores(tmp_path).damage
    wrong = {**good, "chat_template": "yes", "system_instruction": 3}
    (tmp_path / "lm_eval_scores.json").write_text(json.dumps({"entries": [wrong]}), encoding="utf-8")
    damage = read_task_scores(tmp_path).damage
    assert "entries[0].chat_template is 'yes', not true or false" in damage
    assert "entries[0].system_instruction is 3, not text" in damage


def test_entries_take_lm_evals_metrics_and_standard_errors_as_reported():
    results = {  # the shape of simple_evaluate's results (lm-eval 0.4.13), a task and a group
        "results": {
            "gsm8k": {
                "alias": "gsm8k",
                "sample_len": 200,
                "exact_match,strict-match": 0.12,
                "exact_match_stderr,strict-match": 0.023,
                "exact_match,flexible-extract": 0.15,
                "exact_match_stderr,flexible-extract": "N/A",
            },
            "mmlu": {"alias": "mmlu", "sample_len": 570, "acc,none": float("nan"), "sample_count": {"acc,none": 570}},
        },
        "n-shot": {"gsm8k": 5, "mmlu": 0},
        "versions": {"gsm8k": 3.0, "mmlu": "2"},
    }
    entries, missing = task_entries(results, ["gsm8k", "mmlu", "hellaswag"], "tuned", "adapter:abc", 200, "0.4.13")
    assert missing == ["hellaswag"]
    gsm8k, mmlu = entries
    assert gsm8k.metrics == {"exact_match,strict-match": 0.12, "exact_match,flexible-extract": 0.15}
    assert gsm8k.stderr == {"exact_match,strict-match": 0.023}  # "N/A" is no number
    assert (gsm8k.samples, gsm8k.num_fewshot, gsm8k.task_version, gsm8k.limit) == (200, 5, "3.0", 200)
    assert mmlu.metrics == {"acc,none": None} and mmlu.samples == 570 and mmlu.task_version == "2"
    assert not gsm8k.chat_template and gsm8k.system_instruction is None
    chat, _ = task_entries(results, ["gsm8k"], "tuned", "adapter:abc", 200, "0.4.13", chat_template=True,
                           system_instruction="Be brief.")  # fmt: skip
    assert chat[0].chat_template and chat[0].system_instruction == "Be brief."

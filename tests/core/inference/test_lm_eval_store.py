"""RUN_DIR/lm_eval_scores.json: lm-eval task scores stored, replaced only for the same model, weights, task, limit and
shots, read back as written, and a damaged file named and rewritten from what could be read. No lm-eval needed."""

from __future__ import annotations

import json

from hone.core.inference.harness.run import task_entries
from hone.core.inference.harness.store import TaskScore, read_task_scores, store_task_scores


def _score(model="base", task="gsm8k", limit=200, shots=5, value=0.25) -> TaskScore:
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

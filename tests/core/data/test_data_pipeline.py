"""load_training_data end to end: counts that account for every row, max_length policies, eval splits, the cache."""

from __future__ import annotations

import numpy as np
import pytest
from data_helpers import chat, write_jsonl

from hone.core.config import DataConfig
from hone.core.data import IGNORE_INDEX, load_training_data
from hone.core.data.labels import RowEncoder
from hone.core.errors import DataError


def _accounted(report) -> bool:
    return report.rows_read == report.rows_kept + report.held_out + sum(report.skipped.values())


def _rows(n: int, words: int = 3) -> list[dict]:
    return [chat(f"question {i}", " ".join(["answer"] * (words + i % 5))) for i in range(n)]


def test_report_counts_every_row_and_token_stats(tmp_path, smollm2_tokenizer):
    rows = [*_rows(20), {"messages": []}, {"oops": 1}, chat("only a question")]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    with open(path, "a") as f:
        f.write('{"messages": [\n')
    data = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer)
    (report,) = data.reports
    assert (report.rows_read, report.rows_kept) == (24, 20)
    assert report.skipped == {"empty conversation": 1, "missing field": 1, "no assistant turn": 1, "invalid JSON": 1}
    assert _accounted(report)
    assert [e.split(": ")[0] for e in report.skipped_examples] == [f"{path}:{n}" for n in (21, 22, 23, 24)]
    lengths = np.array([len(r.input_ids) for r in data.train])
    trained = sum(sum(1 for x in r.labels if x != IGNORE_INDEX) for r in data.train)
    assert np.array_equal(data.train.lengths, lengths)
    assert (report.tokens, report.trained_tokens) == (lengths.sum(), trained)
    assert data.train.num_tokens == lengths.sum() and data.train.num_trained == trained
    ordered = np.sort(lengths)
    assert (report.length_min, report.length_max) == (ordered[0], ordered[-1])
    assert report.length_median == ordered[(len(ordered) + 1) // 2 - 1]  # the 10th of 20 sorted lengths
    assert report.length_p95 == ordered[19 - 1]  # 95% of 20 rows = 19 rows at most this long
    assert report.format == "messages"


def test_truncate_keeps_the_first_max_length_tokens(tmp_path, smollm2_tokenizer):
    long = chat("Tell me a story", "once upon a time " * 40)
    path = write_jsonl(tmp_path / "a.jsonl", [long, chat("hi", "hello")])
    full = load_training_data(DataConfig(train=[str(path)], max_length=4096), smollm2_tokenizer)
    cut = load_training_data(DataConfig(train=[str(path)], max_length=64), smollm2_tokenizer)
    assert full.train.lengths[0] > 64
    assert cut.train[0].input_ids == full.train[0].input_ids[:64]
    assert cut.train[0].labels == full.train[0].labels[:64]
    assert cut.reports[0].truncated == 1 and cut.reports[0].rows_kept == 2


def test_drop_skips_overlong_rows_and_says_so(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("Tell me a story", "once upon a time " * 40), chat("hi", "yo")])
    data = load_training_data(DataConfig(train=[str(path)], max_length=64, overlong="drop"), smollm2_tokenizer)
    report = data.reports[0]
    assert report.rows_kept == 1 and report.skipped == {"longer than max_length": 1} and report.truncated == 0
    assert f"{path}:1" in report.skipped_examples[0] and "max_length = 64" in report.skipped_examples[0]
    assert data.train[0].source == f"{path}:2"


def test_truncation_that_leaves_nothing_trained_skips_the_row(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("word " * 100, "answer"), chat("hi", "yo")])
    data = load_training_data(DataConfig(train=[str(path)], max_length=32), smollm2_tokenizer)
    assert data.reports[0].skipped == {"no trained tokens": 1}
    assert "raise max_length" in data.reports[0].skipped_examples[0]


def test_eval_fraction_holds_out_rows_by_seed(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", _rows(50))
    cfg = DataConfig(train=[str(path)], eval_fraction=0.2)
    a = load_training_data(cfg, smollm2_tokenizer, seed=1)
    b = load_training_data(cfg, smollm2_tokenizer, seed=1)
    c = load_training_data(cfg, smollm2_tokenizer, seed=2)
    assert (len(a.train), len(a.eval)) == (40, 10)
    sources = lambda s: [r.source for r in s]  # noqa: E731
    assert sources(a.eval) == sources(b.eval) and sources(a.eval) != sources(c.eval)
    assert not set(sources(a.eval)) & set(sources(a.train))
    assert len(set(sources(a.eval)) | set(sources(a.train))) == 50
    train_report, eval_report = a.reports
    assert (train_report.split, train_report.held_out, train_report.rows_kept) == ("train", 10, 40)
    assert (eval_report.split, eval_report.rows_kept) == ("eval", 10)
    assert _accounted(train_report) and _accounted(eval_report)
    assert eval_report.tokens == a.eval.num_tokens


def test_eval_files_are_their_own_split(tmp_path, smollm2_tokenizer):
    train = write_jsonl(tmp_path / "train.jsonl", _rows(6))
    evaluation = write_jsonl(tmp_path / "eval.jsonl", [*_rows(3), {"messages": "nope"}])
    data = load_training_data(DataConfig(train=[str(train)], eval=[str(evaluation)]), smollm2_tokenizer)
    assert (len(data.train), len(data.eval)) == (6, 3)
    assert [r.split for r in data.reports] == ["train", "eval"]
    assert data.reports[1].skipped == {"wrong type": 1}


def test_several_files_concatenate_in_order(tmp_path, smollm2_tokenizer):
    a = write_jsonl(tmp_path / "a.jsonl", _rows(2))
    b = write_jsonl(tmp_path / "b.jsonl", _rows(3))
    data = load_training_data(DataConfig(train=[str(a), str(b)]), smollm2_tokenizer)
    assert [r.source for r in data.train] == [f"{a}:1", f"{a}:2", f"{b}:1", f"{b}:2", f"{b}:3"]


def test_nothing_usable_raises_a_data_error_naming_the_reason(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [chat("q1"), chat("q2")])
    with pytest.raises(DataError) as info:
        load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer)
    assert "no assistant turn" in info.value.message and f"{path}:1" in info.value.message
    assert "hone data check" in info.value.advice


def test_second_run_reads_the_cache_and_a_changed_file_does_not(tmp_path, smollm2_tokenizer, monkeypatch, hone_cache):
    path = write_jsonl(tmp_path / "a.jsonl", [*_rows(8), {"bad": 1}])
    cfg = DataConfig(train=[str(path)])
    first = load_training_data(cfg, smollm2_tokenizer)
    assert any(hone_cache.iterdir()), "nothing was written under $HONE_CACHE/datasets"

    def refuse(*args, **kwargs):
        raise AssertionError("tokenized again although the cache holds this split")

    with monkeypatch.context() as m:
        m.setattr(RowEncoder, "encode", refuse)
        second = load_training_data(cfg, smollm2_tokenizer)
    assert [r.input_ids for r in second.train] == [r.input_ids for r in first.train]
    assert [r.labels for r in second.train] == [r.labels for r in first.train]
    assert [r.source for r in second.train] == [r.source for r in first.train]
    assert second.reports[0].skipped == first.reports[0].skipped == {"missing field": 1}
    assert second.reports[0].rows_read == 9

    write_jsonl(path, _rows(4))
    with monkeypatch.context() as m:
        m.setattr(RowEncoder, "encode", refuse)
        with pytest.raises(AssertionError, match="tokenized again"):
            load_training_data(cfg, smollm2_tokenizer)
    # A different max_length is a different cache entry too.
    with monkeypatch.context() as m:
        m.setattr(RowEncoder, "encode", refuse)
        with pytest.raises(AssertionError, match="tokenized again"):
            load_training_data(DataConfig(train=[str(path)], max_length=100), smollm2_tokenizer)


def test_progress_is_reported_up_to_one(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", _rows(5))
    seen = []
    load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer, progress=lambda m, f: seen.append(f))
    assert seen and seen[-1] == 1.0 and all(0 <= f <= 1 for f in seen) and seen == sorted(seen)


def test_worker_processes_give_the_same_rows(tmp_path, smollm2_tokenizer, monkeypatch):
    """The parallel path (spawned workers render and tokenize) matches the in-process one row for row."""
    rows = [*_rows(40), {"messages": []}, chat("no answer")]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    monkeypatch.setenv("HONE_DATA_WORKERS", "0")
    alone = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer, cache_dir=tmp_path / "c1")
    monkeypatch.setenv("HONE_DATA_WORKERS", "2")
    monkeypatch.setattr("hone.core.data.pipeline.ENCODE_BATCH", 8)  # several batches in flight
    pooled = load_training_data(DataConfig(train=[str(path)]), smollm2_tokenizer, cache_dir=tmp_path / "c2")
    assert [r.input_ids for r in pooled.train] == [r.input_ids for r in alone.train]
    assert [r.labels for r in pooled.train] == [r.labels for r in alone.train]
    assert [r.source for r in pooled.train] == [r.source for r in alone.train]
    assert pooled.reports[0].skipped == alone.reports[0].skipped == {"empty conversation": 1, "no assistant turn": 1}

"""The GRPO demo: its prompts are made the same way every time with no pair of numbers in both splits, its rewards
give a right reply 1 and wrong ones less, and `hone demo --method grpo` trains and reports the held-out reward
before and after (here on a tiny random model), each number what the run's rewards give for the sampled replies."""

from __future__ import annotations

import json
import re

import pytest

from hone.core.demo.grpo_data import (
    EVAL_PROMPTS,
    GRPO_REWARDS,
    TRAIN_PROMPTS,
    make_grpo_dataset,
    write_grpo_dataset,
)


def _numbers(row: dict) -> tuple[int, int]:
    a, b = re.match(r"What is (\d+) \+ (\d+)\?", row["prompt"][-1]["content"]).groups()
    return int(a), int(b)


def test_prompts_are_reproducible_and_held_out_pairs_are_new(tmp_path):
    train, held_out = make_grpo_dataset()
    assert (train, held_out) == make_grpo_dataset()
    assert len(train) == TRAIN_PROMPTS and len(held_out) == EVAL_PROMPTS
    pairs = lambda rows: {frozenset(_numbers(r)) for r in rows}  # noqa: E731
    assert not pairs(train) & pairs(held_out)  # neither order of a held-out pair is trained on
    assert len(pairs(train)) == TRAIN_PROMPTS and len(pairs(held_out)) == EVAL_PROMPTS  # no pair twice
    for row in train + held_out:
        a, b = _numbers(row)
        assert row["answer"] == a + b and [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert any(a > b for a, b in map(_numbers, train)) and any(a < b for a, b in map(_numbers, train))

    first = write_grpo_dataset(tmp_path)
    stamps = [p.stat().st_mtime_ns for p in first]
    assert write_grpo_dataset(tmp_path) == first
    assert [p.stat().st_mtime_ns for p in first] == stamps  # unchanged files are not rewritten
    assert [json.loads(line) for line in first[1].read_text(encoding="utf-8").splitlines()] == held_out


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        ('{"sum": 12}', 1.0),
        ('{"sum":12}\n', 1.0),
        ('{"sum": 13}', 0.5),  # the form, not the number
        ("7 + 5 = 12.", 0.5),  # the number, not the form
        ('```json\n{"sum": 12}\n```', 0.5),  # fenced: not the one line asked for
        ('{\n  "sum": 12\n}', 0.5),  # several lines
        ('{"result": 12}', 0.5),  # another key
        ('{"sum": 11}, so 12', 0.5),
        ("I can't do that.", 0.0),
        ("", 0.0),
    ],
)
def test_the_rewards_give_a_right_reply_1_and_wrong_ones_less(reply, want):
    from hone.core.train.rewards import Sample, build_rewards, score_samples

    row = {"prompt": [{"role": "user", "content": "What is 7 + 5? ..."}], "answer": 12}
    scores = score_samples(build_rewards(GRPO_REWARDS), [Sample(reply, "", row, 5)])
    assert scores.total == [pytest.approx(want)] and not scores.problems


def _table(err: str) -> list[tuple[float, float, float, int, int]]:
    """(mean, format, sum, fully right, replies) of each row of the printed table."""
    found = re.findall(r"│\s*(\d\.\d{3})\s*│\s*(\d\.\d{3})\s*│\s*(\d\.\d{3})\s*│\s*(\d+)/(\d+) \(\d+%\)\s*│", err)
    return [(float(m), float(f), float(s), int(r), int(n)) for m, f, s, r, n in found]


def test_grpo_demo_reports_held_out_reward_before_and_after(tmp_path, capsys, monkeypatch, tiny_model_dir):
    """`hone demo --method grpo` on a tiny random model (2 steps, 3 held-out prompts): it trains a GRPO run on the
    bundled prompts, prints a reward line per step matching metrics.jsonl, and the table's numbers are those of a
    fresh scoring of the base model and of the adapter the run saved."""
    from peft import PeftModel

    from hone.core.cli import main
    from hone.core.config import RunConfig
    from hone.core.demo.grpo import held_out_prompts, score_replies
    from hone.core.models.load import load_model

    monkeypatch.setenv("COLUMNS", "250")  # one table row per line, however long the model's path
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    model = tiny_model_dir("tiny-dense")
    argv = ["demo", "--method", "grpo", "--model", str(model), "--runs-dir", str(runs), "--steps", "2"]
    code = main([*argv, "--eval-rows", "3"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    for who in ("the base model", "the fine-tuned model"):
        assert err.count(f"sampling replies to 3 held-out prompts with {who}: 3 prompts answered, done in ") == 1
    run_dir = next(runs.iterdir())
    assert f"run folder: {run_dir}" in err and f"adapter: {run_dir / 'adapter'}" in err
    config = RunConfig.load(run_dir / "config.toml")
    assert config.train.method == "grpo" and config.grpo.rewards == GRPO_REWARDS

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("event") == "StepMetrics"]
    assert len(steps) == 2
    for s in steps:  # the step's reward line, as metrics.jsonl has it
        line = f"step {s['step']}/2: reward {s['reward_mean']:.2f} ± {s['reward_std']:.2f} (format "
        assert line in err, err[-3000:]
    first, last = steps[0]["reward_mean"], steps[1]["reward_mean"]
    assert f"training reward, mean over steps 1-1: {first:.3f}; over steps 2-2: {last:.3f}" in err

    held_out = re.search(r"held-out prompts: (\S+)", err)[1]
    loaded = load_model(config.model, for_training=False, device="cpu")
    tokenizer = loaded.tokenizer
    prompts = held_out_prompts(config, tokenizer, held_out, limit=3)
    before = score_replies(loaded.model, tokenizer, prompts, config)
    after = score_replies(PeftModel.from_pretrained(loaded.model, str(run_dir / "adapter")), tokenizer, prompts, config)
    rows = _table(err)
    assert len(rows) == 2, err[-3000:]
    for (mean, form, total_sum, right, total), want in zip(rows, (before, after)):
        assert total == want.total == 3 * config.grpo.num_generations and right == want.right
        assert mean == pytest.approx(want.mean, abs=1e-3)
        assert (form, total_sum) == pytest.approx((want.by_reward["format"], want.by_reward["sum"]), abs=1e-3)

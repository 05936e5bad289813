"""The preference demo: its pairs are made the same way every time with the held-out people kept apart, `hone demo
--method dpo` trains and reports held-out ranking before and after (here on a tiny random model), and its numbers are
those `hone eval`'s scorer gives; a method the demo does not train with is refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from hone.core.demo.preference_data import (
    EVAL_PAIRS,
    REJECTIONS,
    TRAIN_PAIRS,
    make_preference_dataset,
    write_preference_dataset,
)


def _answer(pair: dict, side: str) -> str:
    return pair[side][-1]["content"]


def _kind(pair: dict) -> str:
    """How the pair's rejected answer differs from the chosen one, read from the two answers."""
    chosen, rejected = json.loads(_answer(pair, "chosen")), _answer(pair, "rejected")
    if "\n" in rejected:
        assert json.loads(rejected) == chosen
        return "several lines"
    wrong = json.loads(rejected)
    if wrong["job"] != chosen["job"]:
        assert wrong == {**chosen, "job": chosen["job"].capitalize()}
        return "capitalised job"
    assert wrong == {**chosen, "age": str(chosen["age"])}
    return "quoted age"


def test_pairs_are_reproducible_and_held_out_people_are_new(tmp_path):
    train, held_out = make_preference_dataset()
    assert (train, held_out) == make_preference_dataset()
    assert len(train) == TRAIN_PAIRS and len(held_out) == EVAL_PAIRS
    names = lambda pairs: {json.loads(_answer(p, "chosen"))["name"] for p in pairs}  # noqa: E731
    assert not names(train) & names(held_out)
    for pairs in (train, held_out):
        kinds = [_kind(p) for p in pairs]
        assert kinds == [REJECTIONS[i % len(REJECTIONS)] for i in range(len(pairs))]
        for pair in pairs:
            # The chosen answer is the one exact line of JSON, every fact of it read from the text.
            facts, text = json.loads(_answer(pair, "chosen")), pair["prompt"][-1]["content"]
            assert "\n" not in _answer(pair, "chosen") and all(str(v) in text for v in facts.values())
            assert [m["role"] for m in pair["prompt"]] == ["system", "user"]

    first = write_preference_dataset(tmp_path)
    stamps = [p.stat().st_mtime_ns for p in first]
    assert write_preference_dataset(tmp_path) == first
    assert [p.stat().st_mtime_ns for p in first] == stamps  # unchanged files are not rewritten
    rows = [json.loads(line) for line in first[1].read_text(encoding="utf-8").splitlines()]
    assert rows == held_out


def _table_rows(err: str) -> list[tuple[int, int, float]]:
    """(ranked right, pairs, margin) of each row of the printed table."""
    return [(int(a), int(b), float(m)) for a, b, m in re.findall(r"│\s*(\d+)/(\d+) \(\d+%\)\s*│\s*([+-]\d+\.\d+)", err)]


def test_dpo_demo_reports_held_out_ranking_before_and_after(tmp_path, capsys, monkeypatch, tiny_model_dir):
    """`hone demo --method dpo` on a tiny random model (2 steps, 4 held-out pairs): it trains a DPO run on the bundled
    pairs, and the table's counts and margins are those hone eval's scorer (score_pairs: the base as the adapter
    switched off) computes for the same run and pairs."""
    from hone.core.api import ChatModels, held_out_pairs, score_pairs
    from hone.core.cli import main
    from hone.core.config import RunConfig

    monkeypatch.setenv("COLUMNS", "250")  # one table row per line, however long the model's path
    runs = tmp_path / "runs"
    model = tiny_model_dir("tiny-dense")
    argv = ["demo", "--method", "dpo", "--model", str(model), "--runs-dir", str(runs), "--steps", "2"]
    code = main([*argv, "--eval-rows", "4"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    for who in ("the base model", "the fine-tuned model"):
        assert err.count(f"ranking 4 held-out pairs with {who}: 4 pairs ranked, done in ") == 1, err[-3000:]
    run_dir = next(runs.iterdir())
    assert f"run folder: {run_dir}" in err and f"adapter: {run_dir / 'adapter'}" in err
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    config_text = (run_dir / "config.toml").read_text(encoding="utf-8")
    assert 'method = "dpo"' in config_text
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward_margin" in s]
    assert len(steps) == 2 and all(s["reward_accuracy"] is not None for s in steps)

    held_out = re.search(r"held-out pairs: (\S+)", err)[1]
    assert f"rank them again: hone eval {run_dir} --data {held_out}" in err
    models = ChatModels.for_run(run_dir, device="cpu")
    config = RunConfig.load(run_dir / "config.toml")
    want = score_pairs(models, held_out_pairs(config, models.tokenizer, held_out), limit=4)
    (base_right, base_total, base_margin), (tuned_right, tuned_total, tuned_margin) = _table_rows(err)
    assert base_total == tuned_total == want.pairs == 4
    assert (base_right, tuned_right) == (want.base_right, want.tuned_right)
    assert base_margin == pytest.approx(want.base_margin, abs=1e-3)
    assert tuned_margin == pytest.approx(want.tuned_margin, abs=1e-3)


@pytest.mark.parametrize(
    ("argv", "message", "advice"),
    [
        (
            ["--method", "ppo"],
            "the demo does not train with method 'ppo'",
            "use --method sft, dpo, simpo, orpo, kto, grpo",
        ),
        (
            ["--method", "DPO"],
            "the demo does not train with method 'DPO'",
            "use --method sft, dpo, simpo, orpo, kto, grpo",
        ),
        (["--vision", "--method", "grpo"], "--method grpo is for the text demo", "drop --vision"),
        (["--vision", "--method", "dpo"], "--method dpo is for the text demo", "drop --vision"),
    ],
)
def test_a_method_the_demo_does_not_train_with_is_refused(tmp_path, capsys, monkeypatch, argv, message, advice):
    from hone.core.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("HONE_CACHE", str(cache))
    assert main(["demo", "--runs-dir", str(tmp_path / "runs"), *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("hone: error:") and message in lines[0]
    assert lines[1].startswith("hone: advice:") and advice in lines[1]
    assert not (tmp_path / "runs").exists() and not (cache / "demo").exists()  # nothing written, nothing trained

"""Preference runs through Hone's trainer: DPO and SimPO learn to rank the chosen answer first, every step line of
metrics.jsonl carries the reward margin and accuracy, a resumed run goes on exactly, and SFT rows are refused."""

from __future__ import annotations

import json
import random

import pytest

from hone.core import events
from hone.core.train import objectives
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    """16 arithmetic prompts, each with a right answer and a shorter wrong one (so a random model, which gives
    longer answers lower log-probabilities, ranks the wrong one first)."""
    rng = random.Random(0)
    rows = []
    for _ in range(16):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}],
                "chosen": [{"role": "assistant", "content": f"{a} plus {b} is {a + b}, counted on my fingers."}],
                "rejected": [{"role": "assistant", "content": f"{a * b + 3}."}],
            }
        )
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _config(tiny_config, tiny_model_dir, pairs_file, runs, *overrides):
    return tiny_config(
        tiny_model_dir("tiny-dense"),
        (pairs_file, pairs_file),
        runs,
        "data.eval=[]",
        "data.eval_fraction=0.25",
        "train.batch_tokens=512",
        "train.lr=5e-3",
        "train.warmup_steps=0",
        "preference.beta=0.5",
        *overrides,
    )


def _run(config) -> list[events.Event]:
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return got


def test_dpo_learns_to_prefer_the_chosen_answers_and_logs_rewards(tiny_config, tiny_model_dir, pairs_file, tmp_path):
    config = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path, 'train.method="dpo"', "train.max_steps=6")
    got = _run(config)
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    first, last = steps[0], steps[-1]
    # Step 1: the adapter starts at zero, so the fine-tune is its reference: every margin is 0, the loss log 2.
    assert first.loss == pytest.approx(0.6931, abs=1e-3) and first.reward_margin == pytest.approx(0.0, abs=1e-6)
    assert last.loss < 0.2 and last.reward_margin > 1.0 and last.reward_accuracy == 1.0
    assert last.chosen_logps - first.chosen_logps > last.rejected_logps - first.rejected_logps
    assert first.trained_tokens == 4  # the step's units are its pairs (12 training pairs in 3 steps an epoch)
    evaluated = [e for e in got if isinstance(e, events.EvalMetrics)]
    assert evaluated and evaluated[-1].loss < 0.6931
    logged = [e for e in read_events(got[-1].run_dir) if isinstance(e, events.StepMetrics)]
    assert len(logged) == 6 and all(e.reward_margin is not None and e.reward_accuracy is not None for e in logged)


def test_simpo_runs_without_a_reference_model(tiny_config, tiny_model_dir, pairs_file, tmp_path, monkeypatch):
    def no_reference(model):
        raise AssertionError("SimPO asked for the reference model")

    monkeypatch.setattr(objectives.preference, "adapter_off", no_reference)
    config = _config(
        tiny_config, tiny_model_dir, pairs_file, tmp_path, 'train.method="simpo"', "train.max_steps=4",
        "preference.beta=2.0", "preference.simpo_gamma=0.5",
    )  # fmt: skip
    steps = [e for e in _run(config) if isinstance(e, events.StepMetrics)]
    assert steps[-1].loss < steps[0].loss and steps[-1].reward_margin > steps[0].reward_margin


def test_a_resumed_dpo_run_goes_on_exactly(tiny_config, tiny_model_dir, pairs_file, tmp_path):
    whole = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "whole", 'train.method="dpo"',
                         "train.max_steps=4"))  # fmt: skip
    first = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "part", 'train.method="dpo"',
                         "train.max_steps=2"))  # fmt: skip
    config = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "part", 'train.method="dpo"',
                     "train.max_steps=4")  # fmt: skip
    resumed = list(Trainer(config, device="cpu", resume_dir=first[-1].run_dir).run())
    assert isinstance(resumed[-1], events.RunFinished), resumed[-1]
    want = [e.loss for e in whole if isinstance(e, events.StepMetrics)][2:]
    got = [e.loss for e in resumed if isinstance(e, events.StepMetrics)]
    assert got == pytest.approx(want, rel=1e-5)


def test_sft_rows_for_a_preference_run_say_what_a_pair_needs(tiny_config, tiny_model_dir, chat_files, tmp_path):
    config = tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path, 'train.method="dpo"', "train.batch_tokens=512"
    )
    failed = list(Trainer(config, device="cpu").run())[-1]
    assert isinstance(failed, events.RunFailed)
    assert "no usable training pairs" in failed.reason and "chosen" in failed.reason
    assert "chosen and rejected" in failed.advice


def test_hone_eval_ranks_held_out_pairs_with_the_base_and_the_fine_tune(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, capsys
):
    from hone.core.api import ChatModels, held_out_pairs, score_pairs
    from hone.core.cli import main

    config = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path, 'train.method="dpo"', "train.max_steps=6")
    run_dir = _run(config)[-1].run_dir
    models = ChatModels.for_run(run_dir, device="cpu")
    pairs = held_out_pairs(config, models.tokenizer)
    scores = score_pairs(models, pairs)
    assert scores.pairs == len(pairs) == 4  # data.eval_fraction = 0.25 of 16
    assert scores.reward_right == 4 and scores.tuned_margin > scores.base_margin
    assert scores.tuned_right >= scores.base_right
    assert main(["eval", run_dir]) == 0
    table = capsys.readouterr().out
    assert f"{scores.base_right}/4" in table and f"{scores.tuned_right}/4" in table and "reward accuracy" in table

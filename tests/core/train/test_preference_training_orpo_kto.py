"""ORPO and KTO runs through Hone's trainer: each learns to prefer the right answers, every step line of
metrics.jsonl carries the reward margin and accuracy, ORPO never asks for the reference model and KTO's first step
(the adapter at zero: the fine-tune is its own reference) has the loss its formula gives."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hone.core import events
from hone.core.train import objectives
from hone.core.train.run_dir import read_events
from hone.core.train.trainer import Trainer

pytestmark = pytest.mark.core


def _arithmetic(count: int = 16) -> list[tuple[list[dict], list[dict], list[dict]]]:
    """Prompts with a right answer and a shorter wrong one (a random model gives longer answers lower
    log-probabilities, so it starts out ranking the wrong one first)."""
    rng = random.Random(0)
    out = []
    for _ in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        out.append(
            (
                [{"role": "user", "content": f"What is {a} plus {b}?"}],
                [{"role": "assistant", "content": f"{a} plus {b} is {a + b}, counted on my fingers."}],
                [{"role": "assistant", "content": f"{a * b + 3}."}],
            )
        )
    return out


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in _arithmetic()]
    return _write(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", rows)


@pytest.fixture(scope="module")
def unpaired_file(tmp_path_factory):
    """The same answers as single rows: the right ones desirable, the wrong ones not."""
    rows = []
    for p, c, r in _arithmetic():
        rows += [{"prompt": p, "completion": c, "label": True}, {"prompt": p, "completion": r, "label": False}]
    return _write(tmp_path_factory.mktemp("unpaired") / "kto.jsonl", rows)


def _config(tiny_config, tiny_model_dir, data_file, runs, *overrides):
    return tiny_config(
        tiny_model_dir("tiny-dense"),
        (data_file, data_file),
        runs,
        "data.eval=[]",
        "data.eval_fraction=0.25",
        "train.batch_tokens=512",
        "train.lr=5e-3",
        "train.warmup_steps=0",
        *overrides,
    )


def _run(config) -> list[events.Event]:
    got = list(Trainer(config, device="cpu").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return got


def _steps(got) -> list[events.StepMetrics]:
    return [e for e in got if isinstance(e, events.StepMetrics)]


def test_orpo_learns_to_prefer_the_chosen_answers_without_a_reference(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, monkeypatch
):
    def no_reference(model):
        raise AssertionError("ORPO asked for the reference model")

    monkeypatch.setattr(objectives.preference, "adapter_off", no_reference)
    config = _config(
        tiny_config, tiny_model_dir, pairs_file, tmp_path, 'train.method="orpo"', "train.max_steps=6",
        "preference.orpo_lambda=1.0",
    )  # fmt: skip
    got = _run(config)
    steps = _steps(got)
    first, last = steps[0], steps[-1]
    assert first.reward_accuracy < 0.5 and last.reward_accuracy == 1.0  # the wrong answers ranked first at the start
    assert last.loss < first.loss and last.reward_margin > first.reward_margin
    assert first.trained_tokens == 4  # the step's units are its pairs (12 training pairs in 3 steps an epoch)
    assert last.nll < first.nll and last.log_odds_ratio > first.log_odds_ratio
    logged = _steps(read_events(got[-1].run_dir))
    assert len(logged) == 6 and all(e.reward_margin is not None and e.reward_accuracy is not None for e in logged)


def test_kto_learns_to_prefer_the_desirable_answers_and_logs_rewards(
    tiny_config, tiny_model_dir, unpaired_file, tmp_path
):
    config = _config(
        tiny_config, tiny_model_dir, unpaired_file, tmp_path, 'train.method="kto"', "train.max_steps=5",
        "preference.beta=0.5",
    )  # fmt: skip
    got = _run(config)
    steps = _steps(got)
    first, last = steps[0], steps[-1]
    # Step 1: the adapter starts at zero, so the fine-tune is its reference: every reward and the KL are 0, and each
    # row's loss is 1 - sigmoid(0) = 0.5 (both weights 1).
    assert first.loss == pytest.approx(0.5, abs=1e-6) and first.reward_accuracy == 0.0 and first.kl == 0.0
    assert last.loss < 0.3 and last.reward_accuracy == 1.0
    # Packs group rows of like length, so some steps' answers all carry one label (no log-probabilities of the other);
    # every step still has a margin, the other label's reward taken from the latest step that had it.
    assert any(s.chosen_logps is None or s.rejected_logps is None for s in steps)
    margins = [s.reward_margin for s in steps]
    assert None not in margins and first.reward_margin == pytest.approx(0.0, abs=1e-6)
    assert margins[-1] > 1.0 and margins[-1] > margins[0]
    assert sum(s.trained_tokens for s in steps[:3]) == 24  # the units are rows: 24 training rows in the first epoch
    evaluated = [e for e in got if isinstance(e, events.EvalMetrics)]
    assert evaluated and evaluated[-1].loss < 0.5
    logged = _steps(read_events(got[-1].run_dir))
    assert len(logged) == 5 and all(e.reward_accuracy is not None and e.reward_margin is not None for e in logged)
    assert [e.reward_margin for e in logged] == [s.reward_margin for s in steps]


def test_pairs_for_a_kto_run_are_unpaired_and_sft_rows_say_what_a_row_needs(
    tiny_config, tiny_model_dir, pairs_file, chat_files, tmp_path
):
    config = _config(
        tiny_config, tiny_model_dir, pairs_file, tmp_path / "pairs", 'train.method="kto"', "train.max_steps=1"
    )
    got = _run(config)
    train = next(e for e in got if isinstance(e, events.DatasetReport) and e.split == "train")
    assert (train.rows_read, train.rows_kept + train.held_out) == (16, 32)  # each pair gives two rows
    assert _steps(got)[0].loss == pytest.approx(0.5, abs=1e-6)
    config = tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path / "sft", 'train.method="kto"', "train.batch_tokens=512"
    )
    failed = list(Trainer(config, device="cpu").run())[-1]
    assert isinstance(failed, events.RunFailed)
    assert "no usable training rows for KTO" in failed.reason and "label" in failed.advice


def test_a_resumed_kto_run_goes_on_exactly(tiny_config, tiny_model_dir, unpaired_file, tmp_path):
    def config(runs, steps: int):
        return _config(
            tiny_config, tiny_model_dir, unpaired_file, runs, 'train.method="kto"', f"train.max_steps={steps}",
            'train.schedule="constant"',  # the learning rate of a step is then the same however long the run
        )  # fmt: skip

    whole = _run(config(tmp_path / "whole", 6))
    first = _run(config(tmp_path / "part", 4))
    resumed = list(Trainer(config(tmp_path / "part", 6), device="cpu", resume_dir=first[-1].run_dir).run())
    assert isinstance(resumed[-1], events.RunFinished), resumed[-1]
    # the margin too: a resumed step whose answers carry one label (step 5 here) takes the other label's reward from
    # the checkpoint
    want = [value for e in _steps(whole)[4:] for value in (e.loss, e.kl, e.reward_margin)]
    got = [value for e in _steps(resumed) for value in (e.loss, e.kl, e.reward_margin)]
    assert len(got) == 6 and got == pytest.approx(want, rel=1e-5)
    assert _steps(resumed)[0].chosen_logps is None  # the first step after the resume has no desirable answer


@pytest.mark.parametrize("method, data", [("dpo", "pairs_file"), ("kto", "unpaired_file")])
def test_a_step_run_again_after_running_out_of_memory_counts_its_rows_once(
    method, data, request, monkeypatch, tiny_config, tiny_model_dir, tmp_path
):
    """The step's first micro-batch is recorded, its second runs out of memory, and the step runs again on smaller
    micro-batches of the same rows: its reward accuracy, margin and log-probabilities are the uninterrupted run's
    (KTO's KL estimate and loss depend on how rows are grouped, so only the per-answer numbers are compared)."""
    data_file = request.getfixturevalue(data)
    settings = (f'train.method="{method}"', "train.max_steps=3", "train.grad_accum=2")
    clean = _steps(_run(_config(tiny_config, tiny_model_dir, data_file, tmp_path / "clean", *settings)))
    cls = type(objectives.build_objective(method, _config(tiny_config, tiny_model_dir, data_file, tmp_path)))
    real, calls = cls.loss_sum, []

    def loss_sum(self, model, batch, *, evaluating=False):
        if not evaluating:
            calls.append(1)
            if len(calls) == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, model, batch, evaluating=evaluating)

    monkeypatch.setattr(cls, "loss_sum", loss_sum)
    got = _run(_config(tiny_config, tiny_model_dir, data_file, tmp_path / "oom", *settings))
    assert any(isinstance(e, events.Notice) and "smaller" in e.message for e in got), "the step ran again"
    # KTO's later steps start from weights its regrouped KL moved a little otherwise: the step run again is compared
    steps, upto = _steps(got), len(clean) if method == "dpo" else 1
    assert len(steps) == len(clean)
    for field in ("reward_accuracy", "reward_margin", "chosen_logps", "rejected_logps"):
        want, have = [getattr(s, field) for s in clean[:upto]], [getattr(s, field) for s in steps[:upto]]
        assert have == pytest.approx(want, rel=1e-5, abs=1e-6), field


def test_the_preflights_trial_leaves_nothing_in_the_first_steps_metrics(
    monkeypatch, tiny_config, tiny_model_dir, pairs_file, tmp_path
):
    """The measured preflight runs the largest micro-batch once before step 1 and trains nothing with it: step 1's
    log-probabilities and accuracy are those of its own pairs, as in a run without the preflight."""
    from test_preflight import MIB, TokenMeter

    from hone.core.memory.run_plan import Memory

    settings = ('train.method="dpo"', "train.max_steps=2")
    clean = _steps(_run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "clean", *settings)))
    trainer = Trainer(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "trial", *settings), device="cpu")
    trainer.memory, trainer.memory_meter = Memory(1024 * MIB, "a simulated GPU"), TokenMeter(monkeypatch, 0, 0)
    got = list(trainer.run())
    assert any(isinstance(e, events.Notice) and e.message.startswith("measured before step 1") for e in got)
    steps = _steps(got)
    for field in ("reward_accuracy", "chosen_logps", "rejected_logps"):
        assert [getattr(s, field) for s in steps] == pytest.approx([getattr(s, field) for s in clean], rel=1e-6), field

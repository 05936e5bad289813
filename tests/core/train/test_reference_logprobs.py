"""The reference log-probabilities of DPO and KTO computed once before step 1 (preference.precompute_reference): the
values are the adapter-off forward's, a run with them trains as a run that computes them in every step, they are
read back from the data cache by a later run and by a resume (no reference forward at all), a damaged cache entry is
computed again, a stop during the pass ends the run before step 1, KTO keeps its KL term per step, and two processes
each compute their share."""

from __future__ import annotations

import json
import os
import random
import subprocess

import peft
import pytest
import torch

from hone.core import events
from hone.core.control import RunControl
from hone.core.train.objectives import DirectPreferenceOptimization, KahnemanTverskyOptimization
from hone.core.train.objectives.logprobs import sequence_logprobs
from hone.core.train.trainer import Trainer

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    """16 arithmetic prompts, each with a right answer and a wrong one."""
    rng = random.Random(1)
    rows = []
    for _ in range(16):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}],
                "chosen": [{"role": "assistant", "content": f"{a} plus {b} is {a + b}."}],
                "rejected": [{"role": "assistant", "content": f"It is {a * b + 3}, I think."}],
            }
        )
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own data cache: what one run keeps is what the next one of the test reads."""
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def reference_forwards(monkeypatch):
    """How many times the adapter was switched off (one reference forward each), counted as runs go."""
    calls = []
    real = peft.PeftModel.disable_adapter

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(peft.PeftModel, "disable_adapter", counted)
    return calls


def _config(tiny_config, tiny_model_dir, pairs_file, runs, *overrides):
    return tiny_config(
        tiny_model_dir("tiny-dense"), (pairs_file, pairs_file), runs, "data.eval=[]", "data.eval_fraction=0.25",
        "train.batch_tokens=512", "train.lr=5e-3", "train.warmup_steps=0", "preference.beta=0.5",
        'train.method="dpo"', "train.max_steps=4", *overrides,
    )  # fmt: skip


class Watched(DirectPreferenceOptimization):
    """DPO that keeps what its step before step 1 was given (the run's data, model and StepRunner)."""

    setup = None

    def prepare(self, setup):
        self.setup = setup
        yield from super().prepare(setup)


def _run(config, **kwargs) -> list[events.Event]:
    got = list(Trainer(config, device="cpu", **kwargs).run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return got


def _steps(got) -> list[events.StepMetrics]:
    return [e for e in got if isinstance(e, events.StepMetrics)]


def _reference_notices(got) -> list[str]:
    return [e.message for e in got if isinstance(e, events.Notice) and e.topic == "reference"]


def test_the_precomputed_values_are_the_adapter_off_forward_of_each_pair(tiny_config, tiny_model_dir, pairs_file,
                                                                         tmp_path):  # fmt: skip
    config = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path)
    objective = Watched(config)
    _run(config, objective=objective)
    setup = objective.setup
    model, steps = setup.model, setup.steps
    moved = 0.0
    for dataset in (setup.data.train, setup.data.eval):
        for i in range(len(dataset)):
            batch = steps.collate_rows(dataset, [i])  # the pair alone: its values came from a pack of several
            with torch.no_grad():
                tuned, _ = sequence_logprobs(model, batch)
                with model.disable_adapter():
                    base, _ = sequence_logprobs(model, batch)
            assert batch.reference.dtype == torch.float32 and batch.reference.shape == (2,)
            torch.testing.assert_close(batch.reference, base, rtol=0, atol=2e-5)
            moved = max(moved, float((tuned - base).abs().max()))
    assert moved > 1e-2  # the trained adapter moved the answers: the values are the base model's, not the fine-tune's


def test_dpo_with_the_reference_computed_once_trains_as_with_it_in_every_step(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, reference_forwards
):
    # 4 steps of one micro-batch over 12 training pairs, 3 steps an epoch: step 4 groups its rows as epoch 2 packs them
    every_step = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "off",
                              "preference.precompute_reference=false"))  # fmt: skip
    on_the_fly = len(reference_forwards)
    reference_forwards.clear()
    once = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "on"))
    assert on_the_fly == 4 + 1  # every step's micro-batch, and the evaluation's one at the end
    assert len(reference_forwards) == 3 + 1  # each training pair once (an epoch's 3 packs), each evaluation pair once
    assert "computing the base model's log-probabilities of 16 pairs once" in _reference_notices(once)[0]
    for name in ("loss", "grad_norm", "reward_margin", "reward_accuracy", "chosen_logps", "rejected_logps"):
        want, got = ([getattr(e, name) for e in _steps(r)] for r in (every_step, once))
        assert got[:3] == want[:3], name  # the first epoch: the step's own micro-batches, bit for bit
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), name
    evaluated = [[e.loss for e in r if isinstance(e, events.EvalMetrics)] for r in (every_step, once)]
    assert evaluated[1] == pytest.approx(evaluated[0], rel=1e-5) and evaluated[0]
    from safetensors.torch import load_file

    weights = [load_file(f"{r[-1].adapter_dir}/adapter_model.safetensors") for r in (every_step, once)]
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_later_run_and_a_resume_read_the_values_back_and_the_resume_goes_on_bit_for_bit(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, reference_forwards
):
    whole = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "whole"))
    assert len(reference_forwards) == 4
    reference_forwards.clear()

    # the same run again, in another folder: every value from the data cache, no reference forward at all
    again = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "again"))
    assert reference_forwards == [] and "read from the data cache" in _reference_notices(again)[0]
    assert [e.loss for e in _steps(again)] == [e.loss for e in _steps(whole)]

    # stopped after step 2 and resumed: the resume reads the values back and its steps are the uninterrupted run's
    control = RunControl()
    config = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "part")
    stopped = []
    for event in Trainer(config, control, device="cpu").run():
        stopped.append(event)
        if isinstance(event, events.StepMetrics) and event.step == 2:
            control.stop()
    assert isinstance(stopped[-1], events.RunFinished) and stopped[-1].stopped and stopped[-1].step == 2
    reference_forwards.clear()
    resumed = _run(config, resume_dir=stopped[-1].run_dir)
    assert reference_forwards == []
    assert [e.step for e in _steps(resumed)] == [3, 4]
    for name in ("loss", "grad_norm", "reward_margin"):
        assert [getattr(e, name) for e in _steps(resumed)] == [getattr(e, name) for e in _steps(whole)[2:]], name


def test_a_damaged_cache_entry_is_computed_again(tiny_config, tiny_model_dir, pairs_file, tmp_path, own_cache,
                                                 reference_forwards):  # fmt: skip
    first = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "first"))
    (entry,) = (own_cache / "datasets" / "reference").iterdir()
    values = entry / "values.npy"
    data = bytearray(values.read_bytes())
    data[-3] ^= 0x40  # one bit of one value: a file changed on disk
    values.write_bytes(bytes(data))
    reference_forwards.clear()
    second = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "second"))
    assert len(reference_forwards) == 4  # nothing of the damaged entry was trusted
    assert "computing the base model's log-probabilities of 16 pairs once" in _reference_notices(second)[0]
    assert [e.loss for e in _steps(second)] == [e.loss for e in _steps(first)]

    (entry / "values.npy").write_bytes(b"")  # cut short: computed again, and the entry written anew
    reference_forwards.clear()
    _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "third"))
    assert len(reference_forwards) == 4 and (entry / "values.npy").stat().st_size > 0


def test_a_short_run_computes_only_the_rows_its_steps_take(tiny_config, tiny_model_dir, pairs_file, tmp_path,
                                                           reference_forwards):  # fmt: skip
    got = _run(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path, "train.max_steps=1", "data.eval_fraction=0"))
    assert len(reference_forwards) == 1  # one pack: the first step's 4 pairs, never the 12 of the whole epoch
    assert "log-probabilities of 4 pairs once" in _reference_notices(got)[0]


def test_the_pass_reports_progress_and_a_stop_during_it_ends_the_run_before_step_1(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, own_cache, monkeypatch, reference_forwards
):
    from hone.core.train.objectives import reference_logprobs

    monkeypatch.setattr(reference_logprobs, "PROGRESS_EVERY_S", 0.0)  # a progress notice after every micro-batch
    control = RunControl()
    got = []
    for event in Trainer(_config(tiny_config, tiny_model_dir, pairs_file, tmp_path), control, device="cpu").run():
        got.append(event)
        if isinstance(event, events.Notice) and "%" in event.message:
            control.stop()  # after the pass's first micro-batch of its 4 (3 training packs, 1 of evaluation)
    notices = _reference_notices(got)
    assert notices[1] == "the base model's log-probabilities: 19% of 16 pairs done"  # the first pack's 3 pairs
    assert "stopped while computing" in notices[-1] and len(reference_forwards) == 1
    assert isinstance(got[-1], events.RunFinished) and got[-1].stopped and got[-1].step == 0
    assert not (own_cache / "datasets" / "reference").exists()  # nothing half-computed was kept


class WatchedKto(KahnemanTverskyOptimization):
    setup = None

    def prepare(self, setup):
        self.setup = setup
        yield from super().prepare(setup)


def test_kto_reads_its_rows_reference_from_the_pass_and_keeps_the_kl_term_per_step(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, monkeypatch
):
    from hone.core.train.objectives import kto

    forwards = []
    real = kto.sequence_logprobs
    monkeypatch.setattr(kto, "sequence_logprobs", lambda *a, **k: forwards.append(1) or real(*a, **k))

    def config(runs, *overrides):
        return _config(tiny_config, tiny_model_dir, pairs_file, runs, 'train.method="kto"', "train.max_steps=6",
                       "data.eval_fraction=0", *overrides)  # fmt: skip

    every_step = _run(config(tmp_path / "off", "preference.precompute_reference=false"))
    assert len(forwards) == 4 * 6  # a micro-batch a step: the policy's, the KL pairs' twice, the rows' reference
    forwards.clear()
    objective = WatchedKto(config(tmp_path / "on"))
    once = _run(config(tmp_path / "on"), objective=objective)
    epoch = objective.setup.stream.plan(0)
    assert len(epoch) < 6 and "log-probabilities of 32 rows once" in _reference_notices(once)[0]
    assert len(forwards) == 3 * 6 + len(epoch)  # each row's reference once, in the packs of the first epoch
    for name in ("loss", "kl", "reward_margin", "grad_norm"):
        want, got = ([getattr(e, name) for e in _steps(r)] for r in (every_step, once))
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6), name


def test_the_setting_is_checked_and_on_by_default(tmp_path):
    from hone.core.config import RunConfig
    from hone.core.errors import ConfigError

    assert RunConfig().preference.precompute_reference is True
    off = RunConfig().with_overrides(["preference.precompute_reference=false"])
    off.save(tmp_path / "run.toml")
    assert RunConfig.load(tmp_path / "run.toml").preference.precompute_reference is False
    with pytest.raises(ConfigError) as error:
        RunConfig().with_overrides(['preference.precompute_reference="sometimes"'])
    assert "preference.precompute_reference" in error.value.message and "bool" in error.value.advice


@pytest.mark.skipif(
    not torch.distributed.is_available() or os.name != "posix", reason="torch.distributed with gloo, POSIX signals"
)
def test_two_processes_compute_their_shares_and_train_what_one_process_trains(
    tiny_config, tiny_model_dir, pairs_file, tmp_path, own_cache
):
    import numpy as np
    from test_distributed import env, torchrun

    from hone.core.data import cache
    from hone.core.train.run_dir import read_events

    # one process with the micro-batches two processes take: 256 tokens each, two a step (pairs of up to 256 tokens)
    one = _config(tiny_config, tiny_model_dir, pairs_file, tmp_path / "runs", "data.max_length=128",
                  "train.batch_tokens=256", "train.grad_accum=2", "train.max_steps=3", "output.name=one")  # fmt: skip
    single = _run(one)
    two = one.with_overrides(["output.name=two", "train.batch_tokens=512", "train.grad_accum=1"])
    two.save(tmp_path / "two.toml")
    both_cache = tmp_path / "both-cache"
    ran = subprocess.run(
        torchrun(str(tmp_path / "two.toml")), capture_output=True, text=True, timeout=600,
        env=dict(env(), HONE_CACHE=str(both_cache)),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    logged = read_events(tmp_path / "runs" / "two")
    assert "of 16 pairs once" in _reference_notices(logged)[0]
    want = [e.loss for e in _steps(single)]
    assert [e.loss for e in _steps(logged)] == pytest.approx(want, rel=1e-5) and len(want) == 3
    # what process 0 gathered and kept: every value, as one process computed them
    (entry,) = (own_cache / "datasets" / "reference").iterdir()
    (shared,) = (both_cache / "datasets" / "reference").iterdir()
    size = len(np.load(entry / "known.npy"))
    expected = {"values": (np.float32, (size,)), "known": (np.bool_, (size,))}
    alone, gathered = (cache.load_checked_arrays(folder, expected) for folder in (entry, shared))
    assert gathered["known"].all() and alone["known"].all()
    np.testing.assert_allclose(gathered["values"], alone["values"], rtol=0, atol=2e-5)

"""output.report_to: step and eval metrics in TensorBoard (real files, read back with TensorBoard's own reader) and
W&B (a stand-in module that records the calls: no network); a reporter that is not installed stops the run before
anything is written."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from hone.core import events
from hone.core.config import RunConfig
from hone.core.errors import ConfigError
from hone.core.train import reporting
from hone.core.train.trainer import Trainer


@pytest.mark.parametrize("value", ['["mlflow"]', '["tensorboard", "tensorboard"]'])
def test_report_to_takes_each_known_reporter_once(value):
    with pytest.raises(ConfigError, match=r"output\.report_to"):
        RunConfig().with_overrides([f"output.report_to={value}"])
    assert RunConfig().with_overrides(['output.report_to=["tensorboard", "wandb"]']).output.report_to == [
        "tensorboard",
        "wandb",
    ]


def _run(tiny_model_dir, chat_files, tiny_config, tmp_path, *settings):
    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        tmp_path / "runs",
        "train.max_steps=3",
        "train.eval_every=2",
        'output.name="r"',
        *settings,
    )
    return list(Trainer(config, device="cpu").run()), tmp_path / "runs" / "r"


def test_tensorboard_gets_every_step_and_eval(tiny_model_dir, chat_files, tiny_config, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    got, run_dir = _run(tiny_model_dir, chat_files, tiny_config, tmp_path, 'output.report_to=["tensorboard"]')
    assert isinstance(got[-1], events.RunFinished), got[-1]
    logs = EventAccumulator(str(run_dir / reporting.TENSORBOARD_DIR))
    logs.Reload()
    losses = {s.step: s.value for s in logs.Scalars("train/loss")}
    expected = {e.step: e.loss for e in got if isinstance(e, events.StepMetrics)}
    assert losses == pytest.approx(expected, rel=1e-6)
    evals = {e.step: e.loss for e in got if isinstance(e, events.EvalMetrics)}
    assert {s.step: s.value for s in logs.Scalars("eval/loss")} == pytest.approx(evals, rel=1e-6)
    assert {"train/lr", "train/grad_norm", "train/tokens_per_s", "memory/allocated_gib"} <= set(logs.Tags()["scalars"])


class _FakeWandb:
    """The part of wandb's API Hone calls, recording each call."""

    def __init__(self):
        self.inits, self.logged, self.finished = [], [], 0

    def module(self) -> types.ModuleType:
        module = types.ModuleType("wandb")
        module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        module.init = self.init
        return module

    def init(self, **kwargs):
        self.inits.append(kwargs)
        outer = self

        class Run:
            def log(self, data, step):
                outer.logged.append((step, data))

            def finish(self):
                outer.finished += 1

        return Run()


def test_wandb_gets_one_run_named_after_the_folder_with_every_step(
    monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path
):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake.module())
    got, run_dir = _run(tiny_model_dir, chat_files, tiny_config, tmp_path, 'output.report_to=["wandb"]')
    assert isinstance(got[-1], events.RunFinished), got[-1]
    [init] = fake.inits
    assert init["name"] == "r" and init["dir"] == str(run_dir) and init["resume"] == "allow"
    assert init["config"]["output"]["report_to"] == ["wandb"]
    steps = [(step, data["train/loss"]) for step, data in fake.logged if "train/loss" in data]
    assert steps == [(e.step, e.loss) for e in got if isinstance(e, events.StepMetrics)]
    assert any("eval/loss" in data for _, data in fake.logged) and fake.finished == 1


def test_a_reporter_that_is_not_installed_stops_the_run_before_anything_is_written(
    monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path
):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        reporting.importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a)
    )
    [failed], _ = _run(tiny_model_dir, chat_files, tiny_config, tmp_path, 'output.report_to=["tensorboard"]')
    assert isinstance(failed, events.RunFailed)
    assert failed.reason == "output.report_to asks for tensorboard, which is not installed"
    assert 'pip install "hone-studio[tensorboard]"' in failed.advice
    assert not (tmp_path / "runs").exists()

"""An out-of-memory error mid-run: the step runs again on smaller micro-batches of the same rows, the run goes on
with the same losses as a run that never ran out, and at the floor (one row per micro-batch) it stops with a
checkpoint. The error is injected where a GPU would raise it: in the loss of a micro-batch above a size."""

from __future__ import annotations

import pytest
import torch

from hone.core import events
from hone.core.train.objectives import sft as objective_module
from hone.core.train.step import split_packs
from hone.core.train.trainer import Trainer


def test_split_packs_keeps_rows_and_order():
    lengths = [100, 30, 30, 40, 200, 10]
    packs = [[0, 1, 2, 3], [4, 5]]
    assert split_packs(packs, lengths, 1) == packs
    assert split_packs(packs, lengths, 2) == [[0], [1, 2, 3], [4], [5]]  # 100 | 100, 200 | 10
    assert split_packs(packs, lengths, 8) == [[0], [1], [2], [3], [4], [5]]


def inject_oom(monkeypatch, above_tokens: int, times: int):
    """The first `times` micro-batches holding more than `above_tokens` tokens raise like a full GPU."""
    real, raised = objective_module.loss_sum, []

    def loss_sum(model, batch, **kwargs):
        if batch.num_tokens > above_tokens and len(raised) < times:
            raised.append(batch.num_tokens)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch, **kwargs)

    monkeypatch.setattr(objective_module, "loss_sum", loss_sum)
    return raised


def losses(got):
    return [e.loss for e in got if isinstance(e, events.StepMetrics)]


def test_a_run_continues_on_smaller_micro_batches(monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path):
    model = tiny_model_dir("tiny-dense")
    clean = list(Trainer(tiny_config(model, chat_files, tmp_path / "clean", "train.max_steps=4"), device="cpu").run())
    assert isinstance(clean[-1], events.RunFinished)
    raised = inject_oom(monkeypatch, above_tokens=64, times=1)
    got = list(Trainer(tiny_config(model, chat_files, tmp_path / "oom", "train.max_steps=4"), device="cpu").run())
    assert raised and isinstance(got[-1], events.RunFinished), got[-1]
    [notice] = [e for e in got if isinstance(e, events.Notice) and e.topic == "memory" and e.step is not None]
    assert "running each micro-batch as 2 smaller ones" in notice.message
    assert losses(got) == pytest.approx(losses(clean), rel=1e-5)  # the same rows per step: the same curve


def test_at_the_floor_the_run_stops_with_a_checkpoint(monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path):
    inject_oom(monkeypatch, above_tokens=0, times=10**6)
    got = list(
        Trainer(
            tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=4"), device="cpu"
        ).run()
    )
    failed = got[-1]
    assert isinstance(failed, events.RunFailed) and "even with one row per micro-batch" in failed.reason
    assert "hone plan" in failed.advice
    assert isinstance(got[-2], events.CheckpointSaved) and got[-2].step == 0

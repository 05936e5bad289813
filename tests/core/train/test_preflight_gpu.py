"""The measured preflight and out-of-memory recovery on a real GPU (`pytest -m gpu`): the preflight's measured need
covers what the steps then allocate, and a step that runs out of memory mid-run (the rest of a memory cap taken for
that step) goes on as smaller micro-batches with the loss curve of a run that never ran out."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hone.core import events
from hone.core.memory.run_plan import MEMORY_ENV
from hone.core.train.objectives import sft as objective_module
from hone.core.train.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GIB = 2**30


def run(config):
    got = list(Trainer(config, device="cuda").run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    return got


def steps(got):
    return [e for e in got if isinstance(e, events.StepMetrics)]


def test_the_preflight_measures_what_the_steps_then_need(
    monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path
):
    monkeypatch.setenv(MEMORY_ENV, "8GiB")
    got = run(tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=4"))
    [measured] = [e for e in got if isinstance(e, events.Notice) and e.message.startswith("measured before step 1")]
    need = float(re.search(r"needs ([\d.]+) GiB", measured.message).group(1)) * GIB
    peak = max(e.mem_allocated for e in steps(got))
    assert peak * 0.95 <= need <= peak * 1.5, (need / GIB, peak / GIB)  # 0.1 GiB rounding in the message


def fill_memory(ballast: list, smallest: int = 512) -> None:
    """Take every byte the allocator can still hand out under the cap: new segments up to the cap and the free blocks
    inside segments already reserved (a step small enough to fit those would not run out of memory), halving the
    request on each refusal down to `smallest` bytes."""
    size = torch.cuda.get_device_properties(0).total_memory
    while size >= smallest:
        try:
            ballast.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 2


def test_an_out_of_memory_step_under_a_cap_continues_with_the_same_curve(
    monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path
):
    config = tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=6", "train.fit_memory=false"
    )
    clean = [e.loss for e in steps(run(config))]
    real, calls, ballast = objective_module.loss_sum, [], []

    def loss_sum(model, batch, **kwargs):  # step 3's first micro-batch: the rest of the cap is taken
        calls.append(1)
        if len(calls) == 3:
            fill_memory(ballast)
        try:
            return real(model, batch, **kwargs)
        except torch.OutOfMemoryError:
            ballast.clear()  # one step out of memory, as another process's burst would make it
            raise

    total = torch.cuda.get_device_properties(0).total_memory
    cap = 4 * GIB
    torch.cuda.set_per_process_memory_fraction(cap / total)
    monkeypatch.setattr(objective_module, "loss_sum", loss_sum)
    try:
        got = run(config.with_overrides([f"output.runs_dir={json.dumps(str(tmp_path / 'oom'))}"]))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert len(calls) > 3, "the run made fewer than 3 loss calls: nothing was taken from the cap"
    [notice] = [e for e in got if isinstance(e, events.Notice) and e.topic == "memory" and e.step is not None]
    assert notice.step == 3 and "running each micro-batch as 2 smaller ones" in notice.message
    assert [e.loss for e in steps(got)] == pytest.approx(clean, rel=1e-2)  # bf16 sums in another order

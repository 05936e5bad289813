"""Memory planning for runs on the CPU: auto-fit against system memory before loading (recompute, then a smaller
batch, when a run would not fit), and an out-of-memory error from torch's CPU allocator ends the run with advice."""

from __future__ import annotations

from hone.core import events
from hone.core.memory.estimate import GIB
from hone.core.memory.fit import HEADROOM
from hone.core.memory.run_plan import Memory
from hone.core.train.objectives import sft as objective_module
from hone.core.train.trainer import Trainer


def test_a_cpu_run_is_fitted_to_system_memory(tiny_model_dir, chat_files, tiny_config, tmp_path):
    trainer = Trainer(
        tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=1"), device="cpu"
    )
    got = list(trainer.run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    [fit] = [e for e in got if isinstance(e, events.Notice) and e.message.startswith("a step needs")]
    assert "GiB free on this computer (system memory)" in fit.message and fit.message.endswith("it fits")
    assert not trainer.memory.gpu and trainer.memory_meter is None  # no preflight: RSS is no allocator peak


def test_a_cpu_run_that_would_not_fit_recomputes(tiny_model_dir, chat_files, tiny_config, tmp_path):
    from hone.core.memory.run_plan import plan_run

    config = tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=1", 'speed.checkpoint="off"'
    )
    off = plan_run(config, Memory(64 * GIB, "cpu", gpu=False)).estimate.peak_bytes
    on = plan_run(config.with_overrides(['speed.checkpoint="gpu"']), Memory(64 * GIB, "cpu", gpu=False))
    trainer = Trainer(config, device="cpu")
    trainer.memory = Memory((off + on.estimate.peak_bytes) / 2 / (1 - HEADROOM), "a small computer", gpu=False)
    got = list(trainer.run())
    assert isinstance(got[-1], events.RunFinished), got[-1]
    assert trainer.config.speed.checkpoint == "gpu"
    [fit] = [e for e in got if isinstance(e, events.Notice) and e.message.startswith("a step needs")]
    assert "activation checkpointing (recompute)" in fit.message and fit.step == 0


def test_the_cpu_allocator_running_out_ends_the_run_with_advice(
    monkeypatch, tiny_model_dir, chat_files, tiny_config, tmp_path
):
    def loss_sum(model, batch, **kwargs):  # what torch raises when malloc fails on Linux
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
            "tried to allocate 17179869184 bytes."
        )

    monkeypatch.setattr(objective_module, "loss_sum", loss_sum)
    got = list(Trainer(tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path), device="cpu").run())
    failed = got[-1]
    assert isinstance(failed, events.RunFailed) and failed.reason.startswith("the computer ran out of memory")
    assert "train.batch_tokens" in failed.advice and "hone plan" in failed.advice

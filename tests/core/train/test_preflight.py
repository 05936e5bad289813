"""The measured preflight: before step 1 the largest micro-batch runs forward and backward once, its peak is held
against the memory the run may use, and a run that would not fit runs each pack as more micro-batches.

On the CPU a meter stands in for the GPU's allocator: it reads the tokens of the micro-batch that ran and answers
with a peak that grows with them (bytes per token), as activations do."""

from __future__ import annotations

import json

import pytest
import torch

from hone.core import events
from hone.core.data.tokenized import IGNORE_INDEX, TokenizedRow
from hone.core.memory.run_plan import Memory
from hone.core.train.checkpoints import latest_checkpoint
from hone.core.train.objectives import sft as objective_module
from hone.core.train.optim import FlatAdamW
from hone.core.train.preflight import ALLOCATOR_MARGIN, Trial, largest_micro_batch, pending_optimizer_bytes, split_for
from hone.core.train.trainer import Trainer

MIB = 2**20


class TokenMeter:
    """`resident` bytes allocated before each trial; peak = resident + `per_token` x the micro-batch's tokens."""

    def __init__(self, monkeypatch, resident: float, per_token: float):
        self.resident, self.per_token, self.tokens, self.trials, self.seen = resident, per_token, 0, [], []
        real = objective_module.loss_sum

        def loss_sum(model, batch, **kwargs):
            self.tokens = batch.num_tokens
            self.seen.append(batch.num_tokens)  # every micro-batch, the preflight's first
            return real(model, batch, **kwargs)

        monkeypatch.setattr(objective_module, "loss_sum", loss_sum)

    def start(self) -> float:
        self.tokens = 0
        return self.resident

    def peak(self) -> float:
        self.trials.append(self.tokens)
        return self.resident + self.per_token * self.tokens


def run(config, *, meter=None, available=None, resume_dir=None):
    trainer = Trainer(config, device="cpu", resume_dir=resume_dir)
    if meter is not None:
        trainer.memory, trainer.memory_meter = Memory(available, "a simulated GPU"), meter
    return trainer, list(trainer.run())


def losses(got):
    return [e.loss for e in got if isinstance(e, events.StepMetrics)]


def memory_notices(got):
    """The preflight's notices (the planner's own fit says its piece first)."""
    return [
        e
        for e in got
        if isinstance(e, events.Notice) and e.topic == "memory" and e.message.startswith("measured before step 1")
    ]


@pytest.fixture
def config(tiny_model_dir, chat_files, tiny_config, tmp_path):
    return lambda name, *more: tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, tmp_path / name, "train.max_steps=4", *more
    )


def test_a_run_that_fits_is_measured_once_and_trains_as_without(monkeypatch, config):
    # LoRA dropout draws random numbers: a preflight that did not give them back would change the losses.
    _, clean = run(config("clean", "lora.dropout=0.1"))
    meter = TokenMeter(monkeypatch, resident=100 * MIB, per_token=MIB / 4)  # 256 tokens: 164 MiB with the state
    trainer, got = run(config("fits", "lora.dropout=0.1"), meter=meter, available=1024 * MIB)
    assert isinstance(got[-1], events.RunFinished), got[-1]
    assert meter.seen[0] == meter.trials[0] >= max(meter.seen[1:5])  # the largest of the 4 steps (then evaluation)
    assert meter.trials[0] > 256 * 0.75
    [notice] = memory_notices(got)
    assert notice.message.startswith(f"measured before step 1: a micro-batch of {meter.trials[0]} tokens needs")
    assert notice.message.endswith("of 1.0 GiB: it fits") and notice.step is None
    assert trainer.split == 1 and len(meter.trials) == 1  # measured once
    assert losses(got) == pytest.approx(losses(clean), rel=1e-6)  # no gradient or random number left behind


def test_a_run_that_does_not_fit_is_split_and_measured_again(monkeypatch, config):
    _, clean = run(config("clean"))
    meter = TokenMeter(monkeypatch, resident=100 * MIB, per_token=MIB)  # 256 tokens: 356 MiB, 128: 228 MiB
    trainer, got = run(config("split", "output.checkpoint_every=2"), meter=meter, available=300 * MIB)
    assert isinstance(got[-1], events.RunFinished), got[-1]
    assert meter.trials[1] < meter.trials[0] * 0.75  # about half: whole rows
    [notice] = memory_notices(got)
    assert notice.level == "warning" and notice.step == 0  # the Monitor marks it before the first step
    assert "each pack runs as 2 micro-batches from step 1" in notice.message and "measured again" in notice.message
    assert trainer.split == 2
    assert losses(got) == pytest.approx(losses(clean), rel=1e-5)  # the same rows per step: the same curve
    state = json.loads((latest_checkpoint(trainer.writer.run_dir) / "state.json").read_text())
    assert state["split"] == 2  # a resumed run goes on with the split it ended with


def test_a_resumed_run_keeps_its_split(monkeypatch, config):
    meter = TokenMeter(monkeypatch, resident=100 * MIB, per_token=MIB)
    first, _ = run(config("resume", "output.checkpoint_every=2", "train.max_steps=2"), meter=meter, available=300 * MIB)
    trainer = Trainer(config("resume", "train.max_steps=4"), device="cpu", resume_dir=first.writer.run_dir)
    got = list(trainer.run())
    assert isinstance(got[-1], events.RunFinished) and trainer.split == 2  # no meter here: only the checkpoint


def test_a_trial_out_of_memory_is_split_without_losing_the_run(monkeypatch, config):
    meter = TokenMeter(monkeypatch, resident=100 * MIB, per_token=MIB / 8)
    real, raised = objective_module.loss_sum, []

    def loss_sum(model, batch, **kwargs):  # the preflight's full micro-batch fails like a full GPU
        if batch.num_tokens > 150 and not raised:
            raised.append(batch.num_tokens)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch, **kwargs)

    monkeypatch.setattr(objective_module, "loss_sum", loss_sum)
    trainer, got = run(config("oom"), meter=meter, available=1024 * MIB)
    assert len(raised) == 1 and isinstance(got[-1], events.RunFinished), got[-1]
    [notice] = memory_notices(got)
    assert f"a micro-batch of {raised[0]} tokens ran out of memory" in notice.message and trainer.split == 2


def test_largest_micro_batch_fills_the_fullest_pack_with_the_longest_row():
    class Rows:
        def __init__(self, rows):
            self.rows, self.lengths = rows, [len(r.input_ids) for r in rows]

        def __getitem__(self, i):
            return self.rows[i]

    rows = Rows([TokenizedRow(list(range(n)), [IGNORE_INDEX] * 2 + list(range(2, n)), f"f:{n}") for n in (30, 70, 50)])
    packs = [[0, 1], [2]]  # 100 and 50 tokens
    got = largest_micro_batch(rows, packs, packing=True)
    assert [len(r.input_ids) for r in got] == [70, 30] and got[1].labels == rows[1].labels[:30]
    assert [len(r.input_ids) for r in largest_micro_batch(rows, packs, packing=False)] == [70]
    rows.rows[1].images.append("pixels")  # an image row is never cut: its placeholder tokens must stay whole
    assert [len(r.input_ids) for r in largest_micro_batch(rows, packs, packing=True)] == [70]


def test_pending_optimizer_state():
    params = [torch.nn.Parameter(torch.zeros(16, 64)), torch.nn.Parameter(torch.zeros(64, 16))]
    adamw = torch.optim.AdamW(params)
    assert pending_optimizer_bytes(adamw) == 2 * 1024 * 8  # two float32 moments per value, made at the first step
    for p in params:
        p.grad = torch.ones_like(p)
    adamw.step()
    assert pending_optimizer_bytes(adamw) == 0
    flat = FlatAdamW([torch.nn.Parameter(torch.zeros(8, 8))], lr=1e-3, weight_decay=0.0)
    assert pending_optimizer_bytes(flat) == 0  # allocated when it is built


def test_split_for_hand_computed():
    available = 1000 * MIB * (1 + ALLOCATOR_MARGIN)  # 1000 MiB usable after the margin
    trial = Trial(tokens=4096, resident=600 * MIB, peak=1100 * MIB)  # 500 MiB transient, 300 MiB of room
    assert split_for(trial, pending=100 * MIB, available=available, split=1) == 2  # 500 / 300 -> 2
    assert split_for(trial, pending=250 * MIB, available=available, split=1) == 4  # 500 / 150 = 3.3 -> 4
    assert split_for(trial, pending=100 * MIB, available=available, split=2) == 4  # on top of the split it had
    assert split_for(Trial(4096, 600 * MIB, None), pending=0, available=available, split=2) == 4  # out of memory
    assert split_for(trial, pending=500 * MIB, available=available, split=1) == 2  # no room at all: halve, go on


def test_largest_micro_batch_of_grpo_prompts_counts_each_prompt_s_whole_group():
    """A GRPO prompt stands for `group` × (prompt + completion) tokens: the stand-in holds as many prompts as the
    fullest pack, whole (a prompt is never cut, and has no images)."""
    from hone.core.data.prompts import PromptRow, PromptSet

    prompts = PromptSet(
        [PromptRow(list(range(n)), f"prompt {n}", {}, f"f:{n}") for n in (10, 30, 20)], group=4, max_completion=20
    )
    assert list(prompts.lengths) == [120, 200, 160]
    got = largest_micro_batch(prompts, [[0, 1], [2]], packing=True)  # 320 and 160 tokens
    assert got == [prompts[1]], "one whole prompt of 200 tokens fits the 320 of the fullest pack"
    got = largest_micro_batch(prompts, [[0, 1, 2]], packing=True)  # 480 tokens: two of the longest
    assert got == [prompts[1], prompts[1]]


def test_layers_that_keep_their_activations_are_given_up_before_the_packs_are_split(monkeypatch, config):
    """speed.keep_layer_activations: a first trial that does not fit recomputes every layer again (cheaper than
    smaller micro-batches) and is measured again at the same split; the run trains as it would have."""
    _, clean = run(config("clean", 'speed.checkpoint="gpu"'))
    meter = TokenMeter(monkeypatch, resident=100 * MIB, per_token=MIB / 2)  # 256 tokens: 228 MiB with the state
    real_peak = meter.peak
    meter.peak = lambda: real_peak() + (400 * MIB if len(meter.trials) == 1 else 0)  # the kept layers' activations
    keep = ('speed.checkpoint="gpu"', "speed.keep_layer_activations=1")
    trainer, got = run(config("kept", *keep), meter=meter, available=400 * MIB)
    assert isinstance(got[-1], events.RunFinished), got[-1]
    [notice] = memory_notices(got)
    assert notice.level == "warning" and notice.step == 0
    assert "the last layer no longer keeps its activations (recomputed instead) from step 1" in notice.message
    assert "measured again" in notice.message and "may still not fit" not in notice.message
    assert trainer.split == 1 and meter.trials[1] == meter.trials[0]  # the same micro-batch, measured again
    checkpointer = trainer.step_loop.setup.offload
    assert checkpointer.kept_layers == 0
    [started] = [e for e in got if isinstance(e, events.RunStarted)]
    assert "the last 1 of 2 layers keep their activations (not recomputed)" in started.speed_paths["checkpoint"]
    assert losses(got) == pytest.approx(losses(clean), rel=1e-5)

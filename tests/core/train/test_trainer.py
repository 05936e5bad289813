"""The training loop end to end on tiny random-init models (CPU): events, run folder, token-weighted loss,
pause / stop, adapter reload."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.train.run_dir import read_events
from hone.core.train.step import PackStream
from hone.core.train.trainer import Trainer


def run_all(trainer) -> list[events.Event]:
    return list(trainer.run())


def test_a_short_run_emits_events_and_writes_its_folder(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.eval_every=2")
    got = run_all(Trainer(config, device="cpu"))
    kinds = [type(e).__name__ for e in got]
    assert "RunFailed" not in kinds, got[-1]
    assert kinds[:3] == ["Notice", "DatasetReport", "DatasetReport"]  # the memory fit (system memory on a CPU)
    assert got[0].topic == "memory" and got[0].message.endswith("it fits")
    assert kinds.index("RunStarted") < kinds.index("StepMetrics")
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    assert [s.step for s in steps] == [1, 2, 3] and all(s.total_steps == 3 for s in steps)
    assert all(s.tokens >= s.trained_tokens > 0 and s.tokens_per_s > 0 and s.grad_norm > 0 for s in steps)
    assert [e.step for e in got if isinstance(e, events.EvalMetrics)] == [2, 3]
    assert steps[0].lr == pytest.approx(1e-3)  # warmup of one step reaches the peak at once
    finished = got[-1]
    assert isinstance(finished, events.RunFinished) and not finished.stopped
    assert finished.final_loss == steps[-1].loss
    run_dir = tmp_path / next(tmp_path.iterdir()).name
    assert read_events(run_dir) == got  # metrics.jsonl holds exactly what was yielded
    for name in (
        "config.toml",
        "train.log",
        "run.json",
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "adapter/tokenizer.json",
        "adapter/README.md",
    ):
        assert (run_dir / name).is_file(), name
    assert RunConfig.load(run_dir / "config.toml") == config
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_loss_is_token_weighted_across_micro_batches(smollm2_tokenizer_dir, chat_files, tiny_config, tmp_path):
    """The first step's loss (LoRA B starts at zero, so the model is the base model) equals the mean cross-
    entropy over every trained token of both micro-batches, computed sequence by sequence with plain torch."""
    import shutil

    from transformers import AutoModelForCausalLM

    from hone.core.data import load_training_data
    from hone.core.models.shapes import build_model

    # Large init: peaky predictions, so per-token losses (and per-micro-batch means) differ clearly.
    model_dir = tmp_path / "model"
    build_model("tiny-llama", initializer_range=0.5).save_pretrained(model_dir)
    for f in smollm2_tokenizer_dir.iterdir():
        shutil.copy(f, model_dir / f.name)
    config = tiny_config(
        model_dir,
        chat_files,
        tmp_path / "runs",
        "train.grad_accum=2",
        "train.batch_tokens=160",
        "data.max_length=160",
        "train.max_steps=1",
    )
    trainer = Trainer(config, device="cpu")
    got = run_all(trainer)
    step = next(e for e in got if isinstance(e, events.StepMetrics))

    data = load_training_data(config.data, trainer.tokenizer, seed=0)
    stream = PackStream(data.train.lengths, 160, 0, True)
    packs = [stream.take(0), stream.take(1)]
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    losses = []  # per micro-batch: (sum, count)
    for pack in packs:
        total, count = 0.0, 0
        for i in pack:
            row = data.train[i]
            ids = torch.tensor([row.input_ids])
            labels = torch.tensor(row.labels[1:])
            with torch.no_grad():
                logits = base(ids).logits[0, :-1]
            ce = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
            total, count = total + ce.item(), count + int((labels != -100).sum())
        losses.append((total, count))
    token_weighted = sum(t for t, _ in losses) / sum(c for _, c in losses)
    mean_of_means = sum(t / c for t, c in losses) / len(losses)
    assert losses[0][1] != losses[1][1]  # unequal micro-batches, so the two means differ
    assert abs(token_weighted - mean_of_means) > 20 * 1e-5 * token_weighted  # 20x the tolerance below
    assert step.loss == pytest.approx(token_weighted, rel=1e-5)
    assert step.trained_tokens == sum(c for _, c in losses)


def test_pause_resume_and_stop_between_steps(tiny_model_dir, chat_files, tiny_config, tmp_path):
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=50")
    control = RunControl()
    got = []
    for event in Trainer(config, control, device="cpu").run():
        got.append(event)
        if isinstance(event, events.StepMetrics) and event.step == 1:
            control.pause()
            threading.Timer(0.2, control.resume).start()
        if isinstance(event, events.StepMetrics) and event.step == 2:
            control.stop()
    kinds = [type(e).__name__ for e in got]
    assert kinds.count("StepMetrics") == 2
    assert kinds.index("RunPaused") < kinds.index("RunResumed") < len(kinds) - 1
    finished = got[-1]
    assert isinstance(finished, events.RunFinished) and finished.stopped and finished.step == 2
    assert any(isinstance(e, events.CheckpointSaved) and e.step == 2 for e in got)
    assert (tmp_path / next(tmp_path.iterdir()).name / "adapter" / "adapter_model.safetensors").is_file()


def test_saved_adapter_reproduces_the_trained_logits(tiny_model_dir, chat_files, tiny_config, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir("tiny-dense")
    trainer = Trainer(tiny_config(model_dir, chat_files, tmp_path, "train.max_steps=4"), device="cpu")
    finished = run_all(trainer)[-1]
    assert isinstance(finished, events.RunFinished)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365]])
    trainer.model.eval()
    with torch.no_grad():
        trained = trainer.model(input_ids=ids).logits
        reloaded = (
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), finished.adapter_dir)
            .eval()(input_ids=ids)
            .logits
        )
        base = AutoModelForCausalLM.from_pretrained(model_dir).eval()(input_ids=ids).logits
    assert (trained - base).abs().max() > 1e-4  # training changed the model
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=1e-6)


def test_unusable_data_fails_with_advice_not_a_traceback(tiny_model_dir, tiny_config, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    config = tiny_config(tiny_model_dir("tiny-dense"), (bad, bad), tmp_path / "runs")
    got = run_all(Trainer(config, device="cpu"))
    failed = got[-1]
    assert isinstance(failed, events.RunFailed)
    assert "bad.jsonl" in failed.reason and failed.advice
    assert not failed.details  # a user mistake, not a crash


@pytest.mark.parametrize("shape", ["tiny-moe-qwen3", "tiny-moe-gptoss"])
def test_moe_models_train_with_lora_dropout(shape, tiny_model_dir, chat_files, tiny_config, tmp_path):
    """peft refuses dropout with expert LoRA; Hone applies it in its own split-LoRA path instead."""
    config = tiny_config(tiny_model_dir(shape), chat_files, tmp_path, "lora.dropout=0.1", "train.max_steps=2")
    got = run_all(Trainer(config, device="cpu"))
    assert isinstance(got[-1], events.RunFinished), got[-1]
    started = next(e for e in got if isinstance(e, events.RunStarted))
    assert started.is_moe and "moe" in started.speed_paths
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    assert all(sum(s.expert_load) > 0 for s in steps)


def test_background_collation_gives_the_same_run(tiny_model_dir, chat_files, tiny_config, tmp_path, monkeypatch):
    """Each step's batches collated on the background thread during the step before: the same losses as collating
    in place, every step after the first served from that thread, and the thread gone after the run."""
    from hone.core.train.step import StepRunner

    threads = []
    collate = StepRunner._collate_packs

    def spy(self, dataset, packs):
        threads.append(threading.current_thread().name)
        return collate(self, dataset, packs)

    monkeypatch.setattr(StepRunner, "_collate_packs", spy)
    losses = {}
    for prefetch in (False, True):
        monkeypatch.setattr(StepRunner, "PREFETCH_ON_CPU", prefetch)
        threads.clear()
        config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / str(prefetch), "train.max_steps=4")
        got = run_all(Trainer(config, device="cpu"))
        losses[prefetch] = [e.loss for e in got if isinstance(e, events.StepMetrics)]
        assert len(losses[prefetch]) == 4, got[-1]
        background = [name for name in threads if name.startswith("hone-collate")]
        assert len(background) == (3 if prefetch else 0), threads
    assert losses[True] == losses[False]
    assert not any(t.name.startswith("hone-collate") for t in threading.enumerate())


def test_steps_report_the_time_they_waited_for_data(tiny_model_dir, chat_files, tiny_config, tmp_path, monkeypatch):
    """A background collation slower than the step shows as data_wait_s (and the step's "waiting for data" share);
    step 1, which collates its own batches, waits for all of its collation."""
    from hone.core.train.step import StepRunner

    delay = 0.4  # far longer than a tiny model's step on the CPU
    collate = StepRunner._collate_packs

    def slow(self, dataset, packs):
        time.sleep(delay)
        return collate(self, dataset, packs)

    monkeypatch.setattr(StepRunner, "_collate_packs", slow)
    monkeypatch.setattr(StepRunner, "PREFETCH_ON_CPU", True)
    config = tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path, "train.max_steps=3")
    steps = [e for e in run_all(Trainer(config, device="cpu")) if isinstance(e, events.StepMetrics)]
    assert len(steps) == 3
    for s in steps:
        assert delay * 0.5 < s.data_wait_s <= s.step_time, s
    assert steps[0].waiting_for_data == 0.0  # the first step always collates in place: nothing to flag
    assert all(s.waiting_for_data == s.data_wait_s / s.step_time for s in steps[1:])

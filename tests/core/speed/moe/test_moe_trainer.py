"""A short training run of a tiny Qwen3-MoE through Hone's trainer: the MoE choice reaches RunStarted, every step
reports its expert load, and the saved adapter loads in peft."""

from __future__ import annotations

from hone.core import events
from hone.core.train.trainer import Trainer


def test_trainer_reports_backend_and_expert_load(tiny_model_dir, chat_files, tiny_config, tmp_path, monkeypatch):
    monkeypatch.delenv("HONE_MOE_BACKEND", raising=False)
    config = tiny_config(
        tiny_model_dir("tiny-moe-qwen3"), chat_files, tmp_path, "speed.moe_backend=torch", "train.max_steps=2"
    )
    got = list(Trainer(config, device="cpu").run())
    assert not isinstance(got[-1], events.RunFailed), got[-1]
    started = next(e for e in got if isinstance(e, events.RunStarted))
    assert started.speed_paths["moe"].startswith("torch:"), started.speed_paths
    steps = [e for e in got if isinstance(e, events.StepMetrics)]
    assert len(steps) == 2
    for step in steps:
        assert len(step.expert_load) == 8  # tiny-moe-qwen3 has 8 experts
        # every routed position counts once per layer and per top-k slot (2 layers, top-2), padding included
        assert sum(step.expert_load) % 4 == 0 and sum(step.expert_load) >= 4 * step.tokens, step.expert_load

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = next(tmp_path.iterdir())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir("tiny-moe-qwen3"))
    loaded = PeftModel.from_pretrained(base, run_dir / "adapter")
    assert any("experts" in name and "lora_A" in name for name, _ in loaded.named_parameters())

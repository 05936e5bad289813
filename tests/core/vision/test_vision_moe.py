"""A vision-language MoE model (tiny Qwen3-VL-MoE): the mixed text + image path and the MoE path at once.

Hone's experts backends with split expert LoRA give the loss and gradients of transformers' eager experts with
peft's LoRA, and the Trainer trains mixed rows on it, with the MoE backend and the family row on the first lines
and expert LoRA in the adapter."""

from __future__ import annotations

import json

import pytest
import torch
from vision_helpers import write_jsonl

from hone.core import events
from hone.core.config import LoraConfig, RunConfig
from hone.core.models.load import info_from_config
from hone.core.speed import moe
from hone.core.train.lora import apply_lora
from hone.core.train.trainer import Trainer
from hone.core.vision import tiny

KIND = "qwen3_vl_moe"


def _loss_and_grads(tokenizer, backend: str):
    model = tiny.build_vision_model(KIND, tokenizer)
    info = info_from_config(model.config, KIND, "folder", 1)
    if backend != "eager":
        assert moe.configure(model, backend, "cpu").name == backend
    torch.manual_seed(1)
    peft_model, report = apply_lora(model, LoraConfig(r=4, alpha=8), info)
    assert report.target_parameters
    if backend == "eager":
        moe.revert_split_lora(peft_model)
        moe.apply_backend(peft_model, "eager")
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    ids = torch.randint(0, 2000, (2, 12), generator=torch.Generator().manual_seed(3))
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}


def test_its_experts_train_like_eager_experts_with_peft(smollm2_tokenizer_dir):
    tokenizer = tiny.vision_tokenizer(KIND, smollm2_tokenizer_dir)
    want_loss, want = _loss_and_grads(tokenizer, "eager")
    assert any(".experts." in n for n in want)
    got_loss, got = _loss_and_grads(tokenizer, "torch")
    assert got_loss == pytest.approx(want_loss, rel=1e-5)
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_trainer_runs_mixed_rows_through_its_moe_path(smollm2_tokenizer_dir, mixed_rows, tmp_path):
    folder, rows = mixed_rows
    model_dir = tiny.save_vision_model(tmp_path / "model", KIND, smollm2_tokenizer_dir)
    data = write_jsonl(folder / f"train-{KIND}.jsonl", rows + rows)
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(data))}]",
            f"output.runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            "data.max_length=128",
            "data.image_max_side=64",
            "train.batch_tokens=160",
            "train.max_steps=2",
            "lora.r=4",
            "speed.moe_backend=torch",
        ]
    )
    seen = list(Trainer(config, device="cpu").run())
    failed = [e for e in seen if isinstance(e, events.RunFailed)]
    assert not failed, failed[0].reason + "\n" + failed[0].details[-2000:]
    started = next(e for e in seen if isinstance(e, events.RunStarted))
    assert started.is_vision and started.speed_paths["moe"].startswith("torch:"), started.speed_paths
    assert started.speed_paths["moe family"].startswith("Qwen3-VL-MoE (qwen3_vl_moe)")
    finished = next(e for e in seen if isinstance(e, events.RunFinished))
    from safetensors import safe_open

    with safe_open(f"{finished.adapter_dir}/adapter_model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert any("experts" in key and "lora_A" in key for key in keys)


def test_the_host_side_merge_trains_like_transformers_own(smollm2_tokenizer_dir, mixed_rows):
    """Images merged at positions found on the host (hone.core.vision.host_merge), deepstack features included: the
    loss and gradients of transformers' own merge on the same packed rows."""
    from test_host_merge import _step
    from test_vision_batches import collator, encode

    from hone.core.config import SpeedConfig
    from hone.core.speed import attention
    from hone.core.vision import host_merge
    from tests.helpers.packed import assert_grads_close

    tokenizer = tiny.vision_tokenizer(KIND, smollm2_tokenizer_dir)
    processor, model = tiny.build_processor(KIND, tokenizer), tiny.build_vision_model(KIND, tokenizer)
    choice = attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    assert choice.host_merge
    folder, rows = mixed_rows
    tokenized = encode(processor, folder, rows)
    make = collator(processor, model, packing=True)
    merged = make.collate(tokenized)
    host_merge.uninstall(model)
    loss_plain, grads_plain = _step(model, make.collate(tokenized))
    assert host_merge.install(model)
    loss_merged, grads_merged = _step(model, merged)
    torch.testing.assert_close(loss_merged, loss_plain, rtol=1e-6, atol=0)
    assert_grads_close(grads_merged, grads_plain, rtol=1e-5, rel_atol=1e-6)

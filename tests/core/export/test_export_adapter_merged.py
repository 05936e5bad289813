"""`adapter` and `merged` exports, checked against references built without the exporter: the LoRA deltas
computed by hand from the adapter files, and the models reloaded by plain transformers / peft."""

from __future__ import annotations

import json

import pytest
import torch
from export_helpers import rel_diff
from safetensors import safe_open

from hone.core.export import export_run


def test_adapter_export_reloads_with_the_adapter_s_meaning(make_run, reference, tmp_path):
    from peft import PeftModel

    run = make_run("tiny-dense")
    result = export_run(run, "adapter", tmp_path / "adapter")
    assert result.passed, result.failures
    names = {p.name for p in result.files}
    assert {
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "export.json",
    } <= names
    assert result.checks["adapter.reload.logits.max_rel_diff"] == 0.0
    ids = reference.ids(run)
    by_hand = reference.logits(reference.merged(run), ids)
    base = reference.base(run)
    assert rel_diff(reference.logits(base, ids), by_hand) > 0.05, "the adapter should change the model visibly"
    reloaded = PeftModel.from_pretrained(base, result.path).eval()
    assert rel_diff(reference.logits(reloaded, ids), by_hand) < 1e-5
    manifest = json.loads((result.path / "export.json").read_text())
    assert manifest["format"] == "adapter" and manifest["passed"] and manifest["checks"] == result.checks


@pytest.mark.parametrize(
    "shape, fmt, dtype", [("tiny-dense", "merged", torch.bfloat16), ("tiny-llama", "merged:f16", torch.float16)]
)
def test_merged_export_holds_the_rounded_merged_weights(make_run, reference, tmp_path, shape, fmt, dtype):
    from transformers import AutoModelForCausalLM

    run = make_run(shape)
    result = export_run(run, fmt, tmp_path / "merged")
    assert result.passed, result.failures
    assert result.checks["merge.logits.max_rel_diff"] < 1e-4
    with safe_open(result.path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert {f.get_slice(k).get_dtype() for k in keys} == {"BF16" if dtype == torch.bfloat16 else "F16"}
    by_hand = reference.merged(run)
    tied = by_hand.config.tie_word_embeddings
    assert ("lm_head.weight" in keys) != tied
    reloaded = AutoModelForCausalLM.from_pretrained(result.path, dtype=torch.float32)
    ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    for name, expected in by_hand.state_dict().items():
        got = reloaded.state_dict()[name]
        assert rel_diff(got, expected.to(dtype).float()) <= ulp, name  # one rounding step at most
    if tied:
        assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    ids = reference.ids(run)
    assert rel_diff(reference.logits(reloaded, ids), reference.logits(by_hand, ids)) < 0.03
    config = json.loads((result.path / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == str(dtype).removeprefix("torch.")


# NF4 code values (QLoRA paper, appendix E): what bitsandbytes maps each 64-weight block onto, scaled by its absmax.
NF4 = torch.tensor(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ]
)


def nf4_round_trip(weight):
    blocks = weight.to(torch.bfloat16).float().reshape(-1, 64)
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    codes = (blocks / absmax).unsqueeze(-1).sub(NF4).abs().argmin(-1)
    return (NF4[codes] * absmax).reshape(weight.shape)


def test_qlora_run_merges_into_the_nf4_base(make_run, reference, tmp_path):
    """A QLoRA adapter was trained on 4-bit weights: the merged model is nf4(W) + delta, not W + delta."""
    from transformers import AutoModelForCausalLM

    pytest.importorskip("bitsandbytes")
    run = make_run("tiny-dense", qlora=True)
    result = export_run(run, "merged", tmp_path / "merged")
    assert result.passed, result.failures
    assert "nf4" in result.checks["merge.qlora_base"]
    base = reference.base(run)
    deltas = reference.lora_deltas(run / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(result.path, dtype=torch.float32)
    for module, delta in deltas.items():
        weight = base.get_submodule(module).weight.detach()
        got = merged.get_submodule(module).weight.detach()
        expected = nf4_round_trip(weight) + delta
        # double quantization stores each block's absmax in 8 bits: ~1% of a weight's size, far below nf4's steps
        assert rel_diff(got, expected) < 0.02, module
        assert rel_diff(got, weight + delta) > 0.03, f"{module}: merged into the full-precision weights"

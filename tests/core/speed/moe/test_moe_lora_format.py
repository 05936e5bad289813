"""Expert LoRA saves and loads in peft's own format: a Hone adapter loads with PeftModel.from_pretrained and gives
Hone's outputs; the target names; install/revert of the split path and of the dropout it sets."""

from __future__ import annotations

import json

import pytest
import torch
from moe_testing import add_lora, build_tiny_moe, token_batch
from torch import nn

from hone.core.speed import moe


@pytest.mark.parametrize("shape", ["tiny-moe-qwen3", "tiny-moe-gptoss"])
def test_saved_adapter_loads_in_peft_with_the_same_outputs(shape, tmp_path, tiny_moe_cache):
    from peft import PeftModel

    peft_model = add_lora(tiny_moe_cache(shape))
    moe.install_split_lora(peft_model, dropout=0.1)
    assert moe.configure(peft_model, "torch").name == "torch"
    peft_model.eval()
    ids = token_batch(seed=3)
    with torch.no_grad():
        hone_logits = peft_model(input_ids=ids).logits
    peft_model.save_pretrained(tmp_path)

    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert sorted(saved["target_parameters"]) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    assert saved["lora_dropout"] == 0.0  # what lets peft load target_parameters adapters

    fresh = tiny_moe_cache(shape)  # same seed: same base weights
    loaded = PeftModel.from_pretrained(fresh, tmp_path).eval()
    assert moe.current_implementation(loaded) != "hone_torch"  # peft's own forward, transformers' experts
    with torch.no_grad():
        peft_logits = loaded(input_ids=ids).logits
    with torch.no_grad(), loaded.disable_adapter():
        base_logits = loaded(input_ids=ids).logits
    err = (hone_logits - peft_logits).abs().max().item()
    assert err < 1e-4, f"peft's forward of the saved adapter differs from Hone's by {err:.3g}"
    assert (hone_logits - base_logits).abs().max().item() > 1e-2, "the adapter should change the outputs"


def test_expert_lora_targets_per_family():
    for shape in ("tiny-moe-qwen3", "tiny-moe-gptoss", "tiny-moe-qwen2"):
        model = build_tiny_moe(shape, layers=1)
        assert moe.expert_lora_targets(model) == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], shape
    from hone.core.models.shapes import build_model

    assert moe.expert_lora_targets(build_model("tiny-dense", layers=1)) == []


def test_targets_are_found_again_on_a_peft_model(tiny_moe_cache):
    peft_model = add_lora(tiny_moe_cache("tiny-moe-qwen3"))
    assert moe.expert_lora_targets(peft_model) == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def test_install_and_revert_split_lora_with_dropout(tiny_moe_cache):
    from peft.tuners.lora.layer import ParamWrapper

    peft_model = add_lora(tiny_moe_cache("tiny-moe-qwen3"))
    q_proj = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    experts = peft_model.base_model.model.model.layers[0].mlp.experts
    assert isinstance(q_proj.lora_dropout["default"], nn.Identity)

    assert moe.install_split_lora(peft_model, dropout=0.25) == 2  # one per layer
    assert type(experts) is moe.SplitLoraParamWrapper
    assert type(experts.base_layer) is ParamWrapper  # inner wrappers keep peft's class
    assert isinstance(q_proj.lora_dropout["default"], nn.Dropout) and q_proj.lora_dropout["default"].p == 0.25
    assert moe.install_split_lora(peft_model, dropout=0.25) == 2  # idempotent

    moe.configure(peft_model, "torch")
    ids = token_batch(seed=4)
    with torch.no_grad():
        peft_model.train()
        first, second = (peft_model(input_ids=ids).logits for _ in range(2))
        peft_model.eval()
        third, fourth = (peft_model(input_ids=ids).logits for _ in range(2))
    assert not torch.equal(first, second), "dropout should make two training forwards differ"
    assert torch.equal(third, fourth), "no dropout in eval mode"

    moe.revert_split_lora(peft_model)
    assert type(experts) is ParamWrapper
    assert isinstance(q_proj.lora_dropout["default"], nn.Identity)


@pytest.mark.parametrize("shape", ["tiny-moe-qwen3", "tiny-moe-gptoss", "tiny-moe-qwen2"])
def test_lora_experts_false_leaves_every_expert_weight_alone(shape):
    """`lora.experts = false` with "all-linear": attention (and shared experts') linears get LoRA, the experts get
    none. peft's own "all-linear" on transformers 5 maps Qwen3-MoE's v4 expert names onto its 3-D expert weights,
    so Hone names the linear layers itself."""
    from hone.core.config import LoraConfig
    from hone.core.models.load import count_params, info_from_config
    from hone.core.models.shapes import build_model
    from hone.core.train.lora import apply_lora

    trained = {}
    for experts in (True, False):
        model = build_model(shape)
        info = info_from_config(model.config, shape, "shape", count_params(model))
        peft_model, _ = apply_lora(model, LoraConfig(r=4, experts=experts), info)
        trained[experts] = {n for n, p in peft_model.named_parameters() if p.requires_grad}
        assert any("q_proj.lora_A" in n for n in trained[experts]), "attention keeps its LoRA"
    assert any(".experts." in n for n in trained[True])
    assert not any(".experts." in n for n in trained[False]), sorted(trained[False])
    assert {n for n in trained[True] if ".experts." not in n and ".gate." not in n} <= trained[False]


@pytest.mark.parametrize("shape", ["tiny-moe-deepseek-v3", "tiny-moe-glm4-lite", "tiny-moe-glm4"])
def test_what_peft_remaps_on_deepseek_and_glm_is_said(shape):
    """peft 0.21 on transformers 5 reads the names gate_proj / up_proj / down_proj as these families' experts: the
    shared experts and the first dense layers (nn.Linear modules of those names) are left without LoRA, and the
    experts get LoRA even with `lora.experts = false`. The LoRA report says both, naming the layers."""
    from hone.core.config import LoraConfig
    from hone.core.models.load import count_params, info_from_config
    from hone.core.models.shapes import build_model
    from hone.core.train.lora import apply_lora

    for experts in (True, False):
        model = build_model(shape)
        info = info_from_config(model.config, shape, "shape", count_params(model))
        peft_model, report = apply_lora(model, LoraConfig(r=4, experts=experts), info)
        wrapped = {n for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
        unadapted = [
            n
            for n, m in peft_model.named_modules()
            if isinstance(m, nn.Linear)
            and ".layers." in n
            and n.endswith(("gate_proj", "up_proj", "down_proj"))
            and n not in wrapped
            and ".lora_" not in n
            and ".base_layer" not in n
        ]
        assert unadapted, "peft leaves the shared experts and dense MLPs alone on this family"
        notes = " ".join(report.notes)
        assert "without LoRA" in notes and "shared_experts" in notes, report.notes
        expert_lora = any(".experts." in n and p.requires_grad for n, p in peft_model.named_parameters())
        assert expert_lora  # with either setting
        assert ("although lora.experts = false" in notes) == (not experts), report.notes


def test_nothing_is_said_where_peft_adapts_what_was_asked():
    from hone.core.config import LoraConfig
    from hone.core.models.load import count_params, info_from_config
    from hone.core.models.shapes import build_model
    from hone.core.train.lora import apply_lora

    model = build_model("tiny-moe-qwen2")
    info = info_from_config(model.config, "tiny-moe-qwen2", "shape", count_params(model))
    _, report = apply_lora(model, LoraConfig(r=4, experts=True), info)
    assert report.notes == []

"""LoRA on vision-language models: on the language model only by default; the projector trained in full (and saved
with the adapter) with lora.train_projector; LoRA on the vision encoder with lora.train_vision_tower."""

from __future__ import annotations

import pytest
from vision_helpers import KINDS

from hone.core.config import LoraConfig
from hone.core.errors import ConfigError
from hone.core.models.load import count_params, info_from_config
from hone.core.train.lora import apply_lora
from hone.core.vision import family_of, tiny


def fresh(kind, smollm2_tokenizer_dir):
    tokenizer = tiny.vision_tokenizer(kind, smollm2_tokenizer_dir)
    model = tiny.build_vision_model(kind, tokenizer)
    return model, info_from_config(model.config, kind, "folder", count_params(model))


def under(name: str, parts) -> bool:
    return any(f".{p}." in f".{name}." for p in parts)


def lora_modules(peft_model) -> list[str]:
    return [n for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and not n.endswith(("lora_A", "lora_B"))]


@pytest.mark.parametrize("kind", KINDS)
def test_default_lora_is_on_the_language_model_only(kind, smollm2_tokenizer_dir):
    model, info = fresh(kind, smollm2_tokenizer_dir)
    family = family_of(model)
    peft_model, report = apply_lora(model, LoraConfig(r=4), info)
    adapted = lora_modules(peft_model)
    assert adapted, "no LoRA at all"
    assert not [n for n in adapted if under(n, family.vision_modules + family.projector_modules)], adapted
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert all("lora_" in n for n in trainable)
    assert report.trainable == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert report.notes == []  # the encoder is left out on purpose: no warning that peft adapted something else
    # every linear layer of the language model is adapted (q, k, v, o, gate, up, down per layer)
    assert len(adapted) == 7 * model.config.get_text_config().num_hidden_layers


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "llava"])
def test_train_projector_trains_it_in_full_and_saves_it(kind, smollm2_tokenizer_dir, tmp_path):
    from safetensors import safe_open

    model, info = fresh(kind, smollm2_tokenizer_dir)
    family = family_of(model)
    projector = {n: p.numel() for n, p in model.named_parameters() if under(n, family.projector_modules)}
    base_report = apply_lora(fresh(kind, smollm2_tokenizer_dir)[0], LoraConfig(r=4), info)[1]
    peft_model, report = apply_lora(model, LoraConfig(r=4, train_projector=True), info)
    assert report.trainable == base_report.trainable + sum(projector.values())
    peft_model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "adapter_model.safetensors"), "pt") as f:
        saved = list(f.keys())
    for name in projector:
        leaf = name.split(f"{family.projector_modules[0]}.", 1)[1]
        assert any(family.projector_modules[0] in k and k.endswith(leaf) for k in saved), (name, saved[:5])


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "gemma3"])
def test_train_vision_tower_puts_lora_on_the_encoder(kind, smollm2_tokenizer_dir):
    model, info = fresh(kind, smollm2_tokenizer_dir)
    family = family_of(model)
    peft_model, _ = apply_lora(model, LoraConfig(r=4, train_vision_tower=True), info)
    adapted = lora_modules(peft_model)
    assert [n for n in adapted if under(n, family.vision_modules)], "no LoRA on the vision encoder"
    assert not [n for n in adapted if under(n, family.projector_modules)]


def test_modules_to_save_trains_a_module_in_full(smollm2_tokenizer_dir):
    model, info = fresh("llava", smollm2_tokenizer_dir)
    tower = sum(p.numel() for n, p in model.named_parameters() if under(n, ("vision_tower",)))
    peft_model, _ = apply_lora(model, LoraConfig(r=4, modules_to_save=["vision_tower"]), info)
    trainable = sum(p.numel() for n, p in peft_model.named_parameters() if p.requires_grad and "lora_" not in n)
    assert trainable == tower
    with pytest.raises(ConfigError, match="no_such_module"):
        apply_lora(fresh("llava", smollm2_tokenizer_dir)[0], LoraConfig(modules_to_save=["no_such_module"]), info)

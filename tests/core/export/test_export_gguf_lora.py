"""GGUF LoRA export: llama.cpp's names, shapes and metadata read back with the gguf package's reader, and the
file's LoRA applied the way llama.cpp applies it (alpha / r * B @ A) reproduces the adapter's logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from export_helpers import ARCH, read, rel_diff, undo_llama_permutation, values

from hone.core.config import RunConfig
from hone.core.export import ExportError, export_run
from hone.core.train.adapter_dir import base_model


def apply_like_llama_cpp(model, fields, tensors, arch):
    """Add alpha / r * lora_b @ lora_a to each base weight, finding the module through gguf's own name table."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    names = get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    modules = {names.get_name(n): n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    alpha = float(fields["adapter.lora.alpha"])
    applied = 0
    with torch.no_grad():
        for name in tensors:
            if not name.endswith(".lora_a"):
                continue
            base = name.removesuffix(".lora_a")
            a, b = values(tensors[name]), values(tensors[f"{base}.lora_b"])
            delta = alpha / b.shape[1] * (b @ a)
            if arch == "llama" and base.endswith(("attn_q.weight", "attn_k.weight")):
                delta = undo_llama_permutation(base, delta, model.config)
            model.get_submodule(modules[base.removesuffix(".weight")]).weight += delta
            applied += 1
    return applied


@pytest.mark.parametrize(
    "shape, kwargs, fmt",
    [
        ("tiny-llama", {}, "gguf-lora"),
        ("tiny-dense", {"rslora": True, "r": 4}, "gguf-lora"),
        ("tiny-qwen2", {}, "gguf-lora:bf16"),
    ],
)
def test_gguf_lora(make_run, reference, tmp_path, shape, kwargs, fmt):
    run = make_run(shape, **kwargs)
    result = export_run(run, fmt, tmp_path / "lora")
    assert result.passed, result.failures
    (path,) = [p for p in result.files if p.suffix == ".gguf"]
    fields, tensors = read(path)
    arch = ARCH[shape]
    assert (fields["general.type"], fields["general.architecture"], fields["adapter.type"]) == ("adapter", arch, "lora")
    # the base as transformers + peft would load it (a bundled model's Hub id), in the file and in export.json
    want_base = base_model(RunConfig.load(run / "config.toml").model).name
    assert fields["general.base_model.0.name"] == want_base
    assert json.loads((result.path / "export.json").read_text())["base_model"] == want_base
    r = kwargs.get("r", 8)
    # rsLoRA scales by alpha / sqrt(r); llama.cpp by alpha / r: the file's alpha is 16 * sqrt(r) then
    assert fields["adapter.lora.alpha"] == pytest.approx(16.0 * (np.sqrt(r) if kwargs.get("rslora") else 1.0))
    base = reference.base(run)
    linear = {n: m for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    assert len(tensors) == 2 * len(linear)  # all-linear: every decoder Linear adapted
    for name, tensor in tensors.items():
        # llama.cpp: a.ne = [in, r], b.ne = [r, out], r shared
        stem, part = name.rsplit(".", 1)
        other = tensors[f"{stem}.lora_b" if part == "lora_a" else f"{stem}.lora_a"]
        a, b = (tensor, other) if part == "lora_a" else (other, tensor)
        assert int(a.shape[1]) == int(b.shape[0]) == r, name
    assert apply_like_llama_cpp(base, fields, tensors, arch) == len(linear)
    ids = reference.ids(run)
    tolerance = 1e-5 if fmt == "gguf-lora" else 2e-2
    assert rel_diff(reference.logits(base, ids), reference.logits(reference.merged(run), ids)) < tolerance


def test_lora_on_the_output_head_is_refused(make_run, tmp_path):
    run = make_run("tiny-llama", targets=("q_proj", "lm_head"))
    with pytest.raises(ExportError, match="lm_head") as e:
        export_run(run, "gguf-lora", tmp_path / "lora")
    assert "merged" in e.value.advice
    assert not (tmp_path / "lora").exists()

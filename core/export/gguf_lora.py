"""`gguf-lora`: the adapter alone as a GGUF LoRA file in llama.cpp's layout (`llama-cli -m base.gguf --lora x.gguf`).

llama.cpp applies each pair as alpha / r * lora_b @ lora_a; where peft's scale for a module differs from that
(rsLoRA, rank or alpha patterns), the ratio is folded into that module's lora_b, so the file adds exactly peft's
delta weights. The file is read back and every module's delta compared with peft's before the export passes.
"""

from __future__ import annotations

import math
import re

from hone.core.export.checks import CheckLog, quiet_transformers
from hone.core.export.formats import ExportError, ExportResult, ExportSpec
from hone.core.export.gguf_arch import check_supported, gguf_tensor_name, to_gguf_layout
from hone.core.export.gguf_model import file_stem
from hone.core.export.source import Progress, Steps, check_space, finish, open_run, output_folder, staged
from hone.core.train.adapter_dir import base_model

# Relative error of scale * B @ A read back vs peft's delta: float32 sums in another order (~1e-6); f16 / bf16
# round both factors (2^-11, 2^-8 each, so twice that on the product) plus margin.
DELTA_TOLERANCE = {"f32": 1e-5, "f16": 3e-3, "bf16": 2e-2}
_PEFT_NAME = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")


def lora_modules(peft_model) -> dict[str, object]:
    """Base module name (e.g. model.layers.0.self_attn.q_proj) -> peft LoRA layer, for every adapted Linear."""
    modules = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            modules[name.removeprefix("base_model.model.")] = module
    return modules


def check_adapter_weights(run) -> None:
    """Refuse adapters llama.cpp's LoRA format cannot express (before anything heavy loads)."""
    from safetensors import safe_open

    config = run.adapter_config
    if config.get("use_dora"):
        raise ExportError(
            "this adapter uses DoRA, which llama.cpp's LoRA format cannot hold",
            "export `gguf` (the merged model) instead",
        )
    with safe_open(run.adapter_dir / "adapter_model.safetensors", "pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            match = _PEFT_NAME.match(key)
            if not match:
                raise ExportError(
                    f"the adapter holds {key}, which is not a LoRA A/B matrix of a linear layer",
                    "GGUF LoRA holds only LoRA matrices; export `gguf` (the merged model) instead",
                )
            if match["module"].endswith(("embed_tokens", "lm_head")):
                raise ExportError(
                    f"the adapter adapts {match['module']}; llama.cpp's LoRA loader does not apply "
                    "adapters to embeddings or the output head",
                    "export `gguf` (merged) instead",
                )


def export_gguf_lora(
    run_dir, out=None, *, dtype: str | None = None, force: bool = False, progress: Progress | None = None
) -> ExportResult:
    """Write the run's adapter as a GGUF LoRA file for llama.cpp (llama, qwen2 and qwen3 bases).

    Layout (llama.cpp's LoRA loader): metadata general.type = "adapter", general.architecture = the base model's,
    adapter.type = "lora", adapter.lora.alpha (float32); for each adapted weight `W` of the base GGUF (e.g.
    `blk.0.attn_q.weight`) two tensors `W.lora_a` (numpy shape (r, in), GGUF ne [in, r]) and `W.lora_b` ((out, r),
    ne [r, out]). llama.cpp adds scale * lora_b @ lora_a with scale = alpha / r, r read from lora_b.

    peft scales by alpha / r, or alpha / sqrt(r) with rsLoRA, with per-module rank and alpha patterns. The file's
    alpha is lora_alpha (times sqrt(r) for rsLoRA), so most modules need nothing; where peft's scale for a module
    differs from what llama.cpp would compute (a rank or alpha pattern), the ratio is folded into that module's
    lora_b. On llama models lora_b's rows get the same per-head rope permutation as the base q/k weights.

    Args:
        run_dir: a run folder with an adapter.
        out: output folder; default RUN_DIR/exports/gguf-lora-<dtype>.
        dtype: "f32" (default), "f16" or "bf16".
        force: replace an existing output folder written by an earlier export.
        progress: called as progress(stage, fraction done).
    """
    import gguf
    from gguf.quants import quantize
    from peft import PeftModel

    from hone.core.models.load import load_config

    spec = ExportSpec("gguf-lora", dtype or "f32")
    run = open_run(run_dir)
    out = output_folder(run, spec, out, force)
    _, _, base_config = load_config(run.config.model)
    arch = check_supported(base_config)
    check_adapter_weights(run)
    steps = Steps(progress, {"loading the base model": 2, "writing the LoRA": 1, "checking the LoRA": 2})
    log = CheckLog()
    adapter_cfg = run.adapter_config
    rank = int(adapter_cfg["r"])
    alpha = float(adapter_cfg["lora_alpha"]) * (math.sqrt(rank) if adapter_cfg.get("use_rslora") else 1.0)
    qtype = gguf.GGMLQuantizationType[spec.type.upper()]
    with staged(out, run.run_dir) as folder, quiet_transformers():
        steps.start("loading the base model")
        loaded = run.load_base()
        model = loaded.model
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        base_tensors = {
            gguf_tensor_name(n): tuple(p.shape)
            for n, p in model.named_parameters(remove_duplicate=False)
            if not (tied and n == "lm_head.weight")
        }
        peft_model = PeftModel.from_pretrained(model, run.adapter_dir)
        modules = lora_modules(peft_model)
        # A and B of every module at the file's type: float32 counts 4 bytes a weight, f16 / bf16 2.
        width = 4 if spec.type == "f32" else 2
        check_space(
            folder,
            sum(m.lora_A["default"].weight.numel() + m.lora_B["default"].weight.numel() for m in modules.values())
            * width,
        )
        steps.start("writing the LoRA")
        path = folder / f"{file_stem(run)}-lora-{spec.type}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        writer.add_name(f"{run.name} (LoRA)")
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base_model(run.config.model).name)
        folded = 0
        for name, module in modules.items():
            target = gguf_tensor_name(f"{name}.weight")
            a = module.lora_A["default"].weight.detach().float()
            b = module.lora_B["default"].weight.detach().float()
            ratio = float(module.scaling["default"]) / (alpha / a.shape[0])
            if not math.isclose(ratio, 1.0, rel_tol=1e-6):
                b, folded = b * ratio, folded + 1
            b = to_gguf_layout(target, b, model.config, arch)
            writer.add_tensor(f"{target}.lora_a", quantize(a.numpy(), qtype), raw_dtype=qtype)
            writer.add_tensor(f"{target}.lora_b", quantize(b.contiguous().numpy(), qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        log.note("gguf_lora.modules", len(modules))
        log.note("gguf_lora.alpha", alpha)
        log.note("gguf_lora.scales_folded_into_b", folded)
        steps.start("checking the LoRA")
        check_lora_file(path, arch, alpha, base_tensors, modules, model.config, spec.type, log)
        result = finish(folder, out, run, spec, log)
    steps.done()
    return result


def check_lora_file(
    path, arch: str, alpha: float, base_tensors: dict, modules: dict, config, dtype: str, log: CheckLog
) -> None:
    """Read the file back with gguf.GGUFReader and check it as llama.cpp's loader would, plus the math.

    Checks the metadata; that every pair names a tensor of the base model's GGUF with shapes llama.cpp accepts;
    and that for every module alpha / r * lora_b @ lora_a from the file equals peft's own delta weight (in GGUF
    layout) within the type's rounding (`DELTA_TOLERANCE`).
    """
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    meta_ok = (
        fields.get("general.type") == "adapter"
        and fields.get("adapter.type") == "lora"
        and fields.get("general.architecture") == arch
        and float(np.float32(fields.get("adapter.lora.alpha", 0.0))) == float(np.float32(alpha))
    )
    log.require(
        "gguf_lora.metadata",
        meta_ok,
        f"LoRA GGUF metadata read back is wrong: type "
        f"{fields.get('general.type')}, adapter {fields.get('adapter.type')}, arch "
        f"{fields.get('general.architecture')}, alpha {fields.get('adapter.lora.alpha')}",
    )
    pairs: dict[str, dict[str, object]] = {}
    for tensor in reader.tensors:
        base, _, part = tensor.name.rpartition(".")
        pairs.setdefault(base, {})[part] = tensor
    expected = {gguf_tensor_name(f"{name}.weight") for name in modules}
    log.require(
        "gguf_lora.tensor_names",
        set(pairs) == expected and all(set(p) == {"lora_a", "lora_b"} for p in pairs.values()),
        f"LoRA GGUF tensors do not pair up with the adapted modules: {sorted(set(pairs) ^ expected)[:3]}",
    )
    unknown = sorted(set(pairs) - set(base_tensors))
    log.require(
        "gguf_lora.base_tensors", not unknown, f"LoRA GGUF names tensors the base GGUF does not have: {unknown[:3]}"
    )
    bad_shapes, worst = [], 0.0
    names = {gguf_tensor_name(f"{name}.weight"): module for name, module in modules.items()}
    for base, pair in pairs.items():
        if set(pair) != {"lora_a", "lora_b"} or base not in base_tensors or base not in names:
            continue
        a_info, b_info = pair["lora_a"], pair["lora_b"]
        out_features, in_features = base_tensors[base]
        # llama.cpp's loader: a.ne[0] == W.ne[0] (inputs), b.ne[1] == W.ne[1] (outputs), a.ne[1] == b.ne[0] (rank)
        if not (
            a_info.shape[0] == in_features and b_info.shape[1] == out_features and a_info.shape[1] == b_info.shape[0]
        ):
            bad_shapes.append(base)
            continue
        a = torch.from_numpy(dequantize(a_info.data, a_info.tensor_type).copy())
        b = torch.from_numpy(dequantize(b_info.data, b_info.tensor_type).copy())
        delta = alpha / int(b_info.shape[0]) * (b @ a)
        reference = to_gguf_layout(base, names[base].get_delta_weight("default").detach().float(), config, arch)
        worst = max(worst, float((delta - reference).abs().max() / (reference.abs().max() or 1.0)))
    log.require(
        "gguf_lora.shapes", not bad_shapes, f"LoRA GGUF tensors with shapes llama.cpp rejects: {bad_shapes[:3]}"
    )
    log.within(
        "gguf_lora.delta.max_rel_diff",
        worst,
        DELTA_TOLERANCE[dtype],
        "alpha / r * lora_b @ lora_a from the file vs peft's delta weights",
    )

"""`gguf`: the merged model as one GGUF file (weights, architecture keys, tokenizer, chat template).

Written with the `gguf` package (no llama.cpp binaries) and proven four ways after writing: metadata, tensors,
tokenizer and logits (`write_checked_gguf` lists them). The decisive check: transformers loading the file gives
the logits of the merged model holding the file's own dequantized weights, which proves layout, names and
metadata whatever the quantization type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hone.core.export.checks import CheckLog, compare_logits, logits_of, probe_ids, probe_text, quiet_transformers
from hone.core.export.formats import DEFAULT_GGUF_TYPE, ExportError, ExportResult, ExportSpec
from hone.core.export.gguf_arch import (
    check_supported,
    from_gguf_layout,
    gguf_tensor_name,
    head_dim,
    model_metadata,
    rope_freq_factors,
    rope_parameters,
    to_gguf_layout,
)
from hone.core.export.gguf_vocab import Vocab, build_vocab
from hone.core.export.merge import Merged, merge_run
from hone.core.export.source import (
    Progress,
    RunSource,
    Steps,
    check_space,
    finish,
    open_run,
    output_folder,
    staged,
)
from hone.core.models.hub_kernels import from_pretrained_options
from hone.core.train.adapter_dir import base_model

# Worst-case |dequantized - original| / max |original| of one tensor, from each type's rounding: f16 and bf16 round
# to 11 and 8 significant bits (2^-11, 2^-8); q8_0 rounds to 1/254 of its 32-weight block's max plus the f16 scale's
# rounding; q5_0 / q4_0 step 1/16 and 1/8 of the block max (a block's largest opposite-sign value can clamp a
# whole step); q5_1 / q4_1 split the block's range into 31 and 15 steps. A margin of ~10% on top.
TENSOR_TOLERANCE = {
    "f32": 0.0,
    "f16": 6e-4,
    "bf16": 4.5e-3,
    "q8_0": 5e-3,
    "q5_1": 0.04,
    "q5_0": 0.07,
    "q4_1": 0.075,
    "q4_0": 0.14,
}
# max |logits(GGUF) - logits(merged)| / max |logits(merged)| on the probe conversation: the quantization's effect.
# About 2x the worst measured per type on tiny random-init models and SmolLM2-135M with a LoRA (the figures:
# docs/performance/export-accuracy.md). A 135M model loses much at 4-5 bits, so the low-bit bounds are loose; the
# layout is proven by the exact comparison with the file's own weights instead.
LOGITS_TOLERANCE = {
    "f32": 1e-5,
    "f16": 5e-3,
    "bf16": 3e-2,
    "q8_0": 0.08,
    "q5_1": 0.5,
    "q5_0": 0.6,
    "q4_1": 0.5,
    "q4_0": 1.5,
}
# GGUF logits (transformers) vs the merged model holding the file's dequantized weights: the same float32 numbers
# through the same code, so only summation order may differ.
SAME_WEIGHTS_TOLERANCE = 1e-5
# Types that need a quantizer block: token embeddings and the output head stay at q8_0 in 4- and 5-bit files
# (they carry a large share of the quality of small models, and llama.cpp's quantizer keeps the head high too).
_LOW_BIT = ("q4_0", "q4_1", "q5_0", "q5_1")
_KEEP_Q8 = ("token_embd.weight", "output.weight")
ROPE_FREQS = "rope_freqs.weight"


@dataclass
class GgufPlan:
    """What goes into the file: tensor name -> (HF parameter name or ROPE_FREQS, numpy shape, GGML type)."""

    arch: str
    qtype: str
    tensors: dict[str, tuple[str, tuple[int, ...], int]]
    metadata: dict[str, tuple]


def ggml_type(qtype: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[qtype.upper()]


def tensor_type(gguf_name: str, shape: tuple[int, ...], qtype: str) -> int:
    """The GGML type of one tensor in a `qtype` file (1-D and unblockable tensors fall back as llama.cpp does)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if len(shape) == 1:
        return GGMLQuantizationType.F32
    wanted = ggml_type("q8_0" if qtype in _LOW_BIT and gguf_name in _KEEP_Q8 else qtype)
    block = GGML_QUANT_SIZES[wanted][0]
    return wanted if shape[-1] % block == 0 else GGMLQuantizationType.F16


def source_array(model, hf_name: str, gguf_name: str, arch: str):
    """The float32 numpy array that goes into the file for one tensor (in llama.cpp's layout)."""
    if hf_name == ROPE_FREQS:
        return rope_freq_factors(model.config)
    tensor = model.get_parameter(hf_name).detach().float()
    return to_gguf_layout(gguf_name, tensor, model.config, arch).contiguous().numpy()


def plan_gguf(model, arch: str, qtype: str, vocab: Vocab, name: str, base: str) -> GgufPlan:
    """Every tensor (name, shape, type) and metadata key of the file, decided before anything is written; the
    checks compare the file against this plan."""
    from gguf import GGUFValueType as T
    from gguf import LlamaFileType

    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {}
    for hf_name, param in model.named_parameters(remove_duplicate=False):
        if tied and hf_name == "lm_head.weight":
            continue
        gguf_name = gguf_tensor_name(hf_name)
        shape = tuple(param.shape)
        tensors[gguf_name] = (hf_name, shape, tensor_type(gguf_name, shape, qtype))
    factors = rope_freq_factors(model.config)
    if factors is not None:
        tensors[ROPE_FREQS] = (ROPE_FREQS, tuple(factors.shape), tensor_type(ROPE_FREQS, factors.shape, qtype))
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16"}.get(qtype, f"MOSTLY_{qtype.upper()}")
    metadata = {
        "general.architecture": (arch, T.STRING),
        "general.type": ("model", T.STRING),
        "general.name": (name, T.STRING),
        "general.file_type": (int(LlamaFileType[file_type]), T.UINT32),
        "general.quantization_version": (2, T.UINT32),  # ggml's current block layout version
        "general.base_model.count": (1, T.UINT32),
        "general.base_model.0.name": (base, T.STRING),
        **model_metadata(model.config, arch),
        **vocab.metadata(),
    }
    return GgufPlan(arch=arch, qtype=qtype, tensors=tensors, metadata=metadata)


def planned_size(plan: GgufPlan) -> int:
    """Bytes of the planned file's tensor data (each type's block size); the header and vocabulary come on top."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES

    total = 0
    for _, shape, qtype in plan.tensors.values():
        block, size = GGML_QUANT_SIZES[qtype]
        total += int(np.prod(shape)) // block * size
    return total


def write_gguf(path: Path, model, plan: GgufPlan, steps: Steps | None = None) -> None:
    """Write the planned file, quantizing one tensor at a time (no second copy of the model in memory)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(path, plan.arch)
    for key, (value, vtype, *sub) in plan.metadata.items():
        if key != "general.architecture":  # GGUFWriter writes it itself
            writer.add_key_value(key, value, vtype, sub[0] if sub else None)
    for gguf_name, (_, shape, qtype) in plan.tensors.items():
        block, size = GGML_QUANT_SIZES[qtype]
        writer.add_tensor_info(
            gguf_name, shape, np.dtype(np.float32), int(np.prod(shape)) // block * size, raw_dtype=qtype
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (gguf_name, (hf_name, _, qtype)) in enumerate(plan.tensors.items()):
        writer.write_tensor_data(quantize(source_array(model, hf_name, gguf_name, plan.arch), qtype))
        if steps:
            steps.within((i + 1) / len(plan.tensors))
    writer.close()


def _same(expected, got) -> bool:
    import numpy as np

    if isinstance(expected, float):
        return got is not None and float(np.float32(expected)) == float(np.float32(got))
    return expected == got


def check_file(path: Path, model, plan: GgufPlan, log: CheckLog) -> None:
    """Checks 1 and 2: metadata and tensors read back with Hone's reader.

    Leaves `model` holding the file's dequantized weights (back in Hugging Face layout), for check 4.
    """
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType

    from hone.core.models.gguf_read import read_gguf

    file = read_gguf(path)
    wrong = [key for key, (value, *_) in plan.metadata.items() if not _same(value, file.metadata.get(key))]
    log.require("gguf.metadata", not wrong, f"GGUF metadata read back differs for: {', '.join(wrong[:5])}")
    names_ok = set(file.tensors) == set(plan.tensors)
    log.require(
        "gguf.tensor_names",
        names_ok,
        f"GGUF tensor names differ: missing {sorted(set(plan.tensors) - set(file.tensors))[:3]}, "
        f"unexpected {sorted(set(file.tensors) - set(plan.tensors))[:3]}",
    )
    bad_shape = [
        n
        for n, (_, shape, qtype) in plan.tensors.items()
        if n in file.tensors and (file.tensors[n].shape != tuple(reversed(shape)) or file.tensors[n].type != qtype)
    ]
    log.require(
        "gguf.tensor_shapes_and_types", not bad_shape, f"GGUF tensors with a wrong shape or type: {bad_shape[:3]}"
    )
    worst: dict[str, float] = {}
    for gguf_name, (hf_name, _, qtype) in plan.tensors.items():
        if gguf_name not in file.tensors:
            continue
        source = source_array(model, hf_name, gguf_name, plan.arch)
        stored = file.array(gguf_name)
        error = float(np.abs(stored - source).max() / (np.abs(source).max() or 1.0))
        kind = GGMLQuantizationType(qtype).name.lower()
        worst[kind] = max(worst.get(kind, 0.0), error)
        if hf_name != ROPE_FREQS and stored.shape == source.shape:
            param = model.get_parameter(hf_name)
            param.data = from_gguf_layout(gguf_name, torch.from_numpy(stored), model.config, plan.arch).to(param.dtype)
    for kind, error in sorted(worst.items()):
        log.within(
            f"gguf.tensors.{kind}.max_rel_error",
            error,
            TENSOR_TOLERANCE[kind],
            f"{kind} tensors read back vs the merged weights",
        )


def transformers_config(folder: Path, file_name: str, model, plan: GgufPlan, log: CheckLog):
    """The config transformers builds from the file, completed where it ignores keys the file states."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, gguf_file=file_name)
    expected = model.config
    fixes = []
    if head_dim(config) != head_dim(expected) and plan.metadata.get(f"{plan.arch}.attention.key_length", (None,))[
        0
    ] == head_dim(expected):
        config.head_dim = head_dim(expected)
        fixes.append(f"head_dim from {plan.arch}.attention.key_length")
    if rope_parameters(expected).get("rope_type") == "llama3" and rope_parameters(config).get("rope_type") != "llama3":
        config.rope_parameters = dict(rope_parameters(expected))
        fixes.append("llama3 rope scaling from the run (the file's rope_freqs tensor is checked against it)")
    log.note("gguf.transformers_config_completed", "; ".join(fixes) or "no")
    fields = (
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "tie_word_embeddings",
    )
    wrong = [
        f"{f}: {getattr(config, f, None)} != {getattr(expected, f, None)}"
        for f in fields
        if getattr(config, f, None) != getattr(expected, f, None)
    ]
    wrong += [f"head_dim: {head_dim(config)} != {head_dim(expected)}"] if head_dim(config) != head_dim(expected) else []
    for name, a, b in (
        ("rms_norm_eps", config.rms_norm_eps, expected.rms_norm_eps),
        ("rope_theta", rope_parameters(config)["rope_theta"], rope_parameters(expected)["rope_theta"]),
    ):
        if abs(a - b) > 1e-6 * abs(b):
            wrong.append(f"{name}: {a} != {b}")
    log.require(
        "gguf.transformers_config",
        not wrong,
        f"transformers reads a different config from the GGUF: {'; '.join(wrong)}",
    )
    return config


def check_with_transformers(path: Path, merged: Merged, plan: GgufPlan, log: CheckLog) -> None:
    """Checks 3 and 4: transformers rebuilds tokenizer and model from the file (after check_file)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        log.require(
            "gguf.tokenizer.chat_template",
            tokenizer.chat_template == merged.tokenizer.chat_template,
            "the chat template read back from the GGUF differs",
        )
        # the run's tokenizer renders the probe: transformers 5.17 swaps BOS and EOS when it rebuilds a tokenizer
        # from any GGUF, which would change templates that write eos_token (the ids are checked in the metadata)
        same = probe_ids(tokenizer, probe_text(merged.tokenizer)).tolist() == merged.ids.tolist()
        log.require(
            "gguf.tokenizer.encoding",
            same,
            "the tokenizer transformers rebuilds from the GGUF encodes the probe conversation differently",
        )
        config = transformers_config(path.parent, path.name, merged.model, plan, log)
        loaded = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, config=config, dtype=torch.float32, **from_pretrained_options()
        ).eval()
    got = logits_of(loaded, merged.ids)
    del loaded
    compare_logits(
        log,
        "gguf.same_weights.logits",
        got,
        logits_of(merged.model, merged.ids),
        SAME_WEIGHTS_TOLERANCE,
        "GGUF (loaded by transformers) vs the merged model holding the file's weights",
    )
    compare_logits(
        log,
        "gguf.logits",
        got,
        merged.merged_logits,
        LOGITS_TOLERANCE[plan.qtype],
        f"{plan.qtype} GGUF (loaded by transformers) vs merged model logits",
    )


def file_stem(run: RunSource) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run.name).strip("-") or "model"


@dataclass
class Prepared:
    """What a GGUF export knows before any weights load."""

    arch: str
    tokenizer: object
    layout: object  # chat_layout.ChatLayout, or None when the template is not per-message
    vocab: Vocab


def prepare(run: RunSource) -> Prepared:
    """Architecture, tokenizer, chat layout and GGUF vocabulary, from configs and tokenizer files only, so that
    what GGUF export cannot do fails before the model is loaded."""
    from hone.core.export.chat_layout import infer_layout
    from hone.core.models.load import load_config, load_tokenizer

    source, folder, config = load_config(run.config.model)
    arch = check_supported(config)
    tokenizer = (
        run.tokenizer(fallback=None)
        if (run.adapter_dir / "tokenizer_config.json").is_file()
        else load_tokenizer(folder, config, run.config.model)
    )
    try:
        layout = infer_layout(tokenizer)
    except ExportError:
        layout = None
    base_gguf = Path(source.path) if source.kind in ("gguf", "bundled") else None
    vocab = build_vocab(
        tokenizer,
        config.vocab_size,
        eot_text=layout.turn_end if layout else None,
        bos_in_template=bool(layout and layout.bos),
        base_gguf=base_gguf,
    )
    return Prepared(arch=arch, tokenizer=tokenizer, layout=layout, vocab=vocab)


def write_checked_gguf(
    run: RunSource, prepared: Prepared, folder: Path, qtype: str, log: CheckLog, steps: Steps
) -> tuple[Path, Merged]:
    """Merge, write `<run>-<qtype>.gguf` into `folder` and check it four ways:

    1. metadata: every key read back (Hone's own reader, gguf_read.py) equals what was meant to be written;
    2. tensors: the names, shapes and types llama.cpp expects, and every tensor's dequantized values within its
       type's rounding bound of the merged weights;
    3. tokenizer: transformers rebuilds the tokenizer from the file; it has the chat template and encodes the
       probe conversation to the same ids;
    4. logits: transformers loads the file (`gguf_file=`); its logits equal (float32 summation aside) those of the
       merged model with its weights replaced by the file's dequantized tensors, which proves the layout, names
       and metadata whatever the type; and they stay within the type's tolerance of the merged model's own
       logits (the quantization's effect, reported with mean KL and top-1 agreement). Where transformers ignores
       a key the file states (qwen3's attention.key_length, llama3 rope scaling, which llama.cpp reads from
       rope_freqs), the config is completed from the file and the run, and that is noted.

    Returns the file and the Merged model, which then holds the file's dequantized weights (see check_file).
    """
    steps.start("loading and merging")
    merged = merge_run(run, log, steps)
    for key, value in prepared.vocab.notes.items():
        log.note(f"gguf.vocab.{key}", value)
    plan = plan_gguf(merged.model, prepared.arch, qtype, prepared.vocab, run.name, base_model(run.config.model).name)
    path = folder / f"{file_stem(run)}-{qtype}.gguf"
    check_space(folder, planned_size(plan))
    steps.start(f"writing {path.name}")
    write_gguf(path, merged.model, plan, steps)
    steps.start("checking the GGUF")
    check_file(path, merged.model, plan, log)
    steps.within(0.3)
    check_with_transformers(path, merged, plan, log)
    return path, merged


def export_gguf(
    run_dir, out=None, *, qtype: str | None = None, force: bool = False, progress: Progress | None = None
) -> ExportResult:
    """Merge the run's adapter into its base and write one GGUF file (llama, qwen2 and qwen3 models).

    Args:
        run_dir: a run folder with an adapter.
        out: output folder; default RUN_DIR/exports/gguf-<qtype>.
        qtype: one of GGUF_TYPES (f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0); default q8_0.
        force: replace an existing output folder written by an earlier export.
        progress: called as progress(stage, fraction done).
    """
    spec = ExportSpec("gguf", qtype or DEFAULT_GGUF_TYPE)
    run = open_run(run_dir)
    out = output_folder(run, spec, out, force)
    prepared = prepare(run)
    steps = Steps(progress, gguf_steps(run, spec.type))
    log = CheckLog()
    with staged(out, run.run_dir) as folder, quiet_transformers():
        write_checked_gguf(run, prepared, folder, spec.type, log, steps)
        result = finish(folder, out, run, spec, log)
    steps.done()
    return result


def gguf_steps(run: RunSource, qtype: str, extra: dict[str, float] | None = None) -> dict[str, float]:
    """Progress stages of a GGUF export (and `extra` ones after it) with their relative cost."""
    return {
        "loading and merging": 3,
        f"writing {file_stem(run)}-{qtype}.gguf": 3,
        "checking the GGUF": 4,
        **(extra or {}),
    }

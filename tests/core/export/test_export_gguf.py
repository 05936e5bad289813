"""GGUF model export for llama, qwen2 and qwen3, read back with the gguf package's own reader and with
transformers, and compared with the adapter merged by hand (not by the exporter)."""

from __future__ import annotations

import math

import pytest
import torch
from export_helpers import ARCH, TINY_VOCAB, gguf_name_of, read, rel_diff, undo_llama_permutation, values

from hone.core.export import export_run
from hone.core.export.gguf_model import LOGITS_TOLERANCE, TENSOR_TOLERANCE


def llama3_factors(config):
    """rope_freqs by the published Llama 3.1 formula: plain / scaled inverse frequency."""
    p = config.rope_parameters
    dim = config.head_dim
    inv = 1.0 / p["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)
    wavelen = 2 * math.pi / inv
    old = p["original_max_position_embeddings"]
    low_wl, high_wl = old / p["low_freq_factor"], old / p["high_freq_factor"]
    smooth = (old / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
    scaled = torch.where(
        wavelen < high_wl,
        inv,
        torch.where(wavelen > low_wl, inv / p["factor"], (1 - smooth) * inv / p["factor"] + smooth * inv),
    )
    return inv / scaled


@pytest.mark.parametrize(
    "shape, qtype", [("tiny-dense", "q8_0"), ("tiny-llama", "f16"), ("tiny-qwen2", "bf16"), ("tiny-llama3", "q4_0")]
)
def test_gguf_export(make_run, reference, tmp_path, shape, qtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    run = make_run(shape)
    result = export_run(run, f"gguf:{qtype}", tmp_path / "gguf")
    assert result.passed, result.failures
    (path,) = [p for p in result.files if p.suffix == ".gguf"]
    assert path.name == f"run-{qtype}.gguf"
    fields, tensors = read(path)
    arch = ARCH[shape]
    merged = reference.merged(run)
    config = merged.config
    tokenizer = AutoTokenizer.from_pretrained(run / "adapter")

    # metadata llama.cpp reads
    assert fields["general.architecture"] == arch and fields["general.type"] == "model"
    expected = {
        "block_count": 2,
        "embedding_length": 64,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "attention.key_length": 16,
        "context_length": config.max_position_embeddings,
        "vocab_size": TINY_VOCAB,
    }
    assert {k: fields[f"{arch}.{k}"] for k in expected} == expected
    assert fields[f"{arch}.rope.freq_base"] == pytest.approx(config.rope_parameters["rope_theta"])
    assert fields[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(config.rms_norm_eps)
    assert fields["tokenizer.ggml.model"] == "gpt2"
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == TINY_VOCAB and tokens[: len(tokenizer)] == tokenizer.convert_ids_to_tokens(
        list(range(len(tokenizer)))
    )
    assert fields["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id
    assert fields["tokenizer.ggml.eot_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fields["tokenizer.chat_template"] == tokenizer.chat_template
    assert len(fields["tokenizer.ggml.merges"]) > 0

    # every merged weight, where llama.cpp's name table puts it, within the type's rounding
    expected_names = set()
    for name, weight in merged.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name = gguf_name_of(name, config, arch)
        expected_names.add(gguf_name)
        got = values(tensors[gguf_name])
        if arch == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            got = undo_llama_permutation(gguf_name, got, config)
        kind = "f32" if weight.dim() == 1 else ("q8_0" if qtype == "q4_0" and "token_embd" in gguf_name else qtype)
        assert rel_diff(got, weight) <= TENSOR_TOLERANCE[kind], gguf_name
    if shape == "tiny-llama3":
        expected_names.add("rope_freqs.weight")
        assert rel_diff(values(tensors["rope_freqs.weight"]), llama3_factors(config)) < 1e-6
    assert set(tensors) == expected_names
    assert ("output.weight" in tensors) == (not config.tie_word_embeddings)

    # transformers loads the file; where it ignores a key (qwen3 head_dim, llama3 scaling) the config is completed
    loaded_config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    loaded_config.head_dim = fields[f"{arch}.attention.key_length"]
    loaded_config.rope_parameters = config.rope_parameters
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, config=loaded_config, dtype=torch.float32
    )
    ids = reference.ids(run)
    assert rel_diff(reference.logits(model, ids), reference.logits(merged, ids)) <= LOGITS_TOLERANCE[qtype]


@pytest.mark.parametrize("qtype", ["f32", "q5_1", "q5_0", "q4_1"])
def test_other_gguf_types(make_run, tmp_path, qtype):
    from gguf import GGMLQuantizationType

    result = export_run(make_run("tiny-dense"), f"gguf:{qtype}", tmp_path / "gguf")
    assert result.passed, result.failures
    _, tensors = read(next(p for p in result.files if p.suffix == ".gguf"))
    types = {name: t.tensor_type for name, t in tensors.items()}
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    assert types["blk.0.ffn_down.weight"] == GGMLQuantizationType[qtype.upper()]
    # 4/5-bit files keep the (tied) embeddings at q8_0
    assert types["token_embd.weight"] == (GGMLQuantizationType.F32 if qtype == "f32" else GGMLQuantizationType.Q8_0)
    if qtype != "f32":
        assert result.checks["gguf.logits.max_rel_diff"] > 1e-4, "a quantized file cannot be exact"


def test_hone_reader_agrees_with_the_gguf_package(make_run, tmp_path):
    """The export checks read files with gguf_read.py; it must see what gguf.GGUFReader sees."""
    from hone.core.models.gguf_read import read_gguf

    result = export_run(make_run("tiny-llama"), "gguf:q4_1", tmp_path / "gguf")
    path = next(p for p in result.files if p.suffix == ".gguf")
    fields, tensors = read(path)
    mine = read_gguf(path)
    assert mine.metadata == {k: v for k, v in fields.items() if not k.startswith("GGUF.")}
    assert (mine.version, len(mine.tensors), len(mine.metadata)) == (
        fields["GGUF.version"],
        fields["GGUF.tensor_count"],
        fields["GGUF.kv_count"],
    )
    assert {n: (t.shape, t.type) for n, t in mine.tensors.items()} == {
        n: (tuple(int(d) for d in t.shape), int(t.tensor_type)) for n, t in tensors.items()
    }
    for name, tensor in tensors.items():
        assert torch.equal(torch.from_numpy(mine.array(name)).reshape(-1), values(tensor).reshape(-1)), name

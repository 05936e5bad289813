from __future__ import annotations

import struct
import time

import pytest
import torch

from hone.core.config import DEMO_MODEL, ModelConfig
from hone.core.errors import ModelError
from hone.core.models.load import inspect_model, load_model, resolve_dtype, resolve_source


def test_resolve_source_kinds(tmp_path, tiny_model_dir):
    assert resolve_source(DEMO_MODEL).kind == "bundled"
    assert resolve_source(str(tiny_model_dir("tiny-dense"))).kind == "folder"
    assert resolve_source("Qwen/Qwen3-0.6B").kind == "hub"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)  # a whole GGUF v3 file: no tensors, no metadata
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(header)
    assert resolve_source(str(gguf)).kind == "gguf"
    assert resolve_source(str(tmp_path)).kind == "gguf"  # a folder with exactly one .gguf
    (tmp_path / "n.gguf").write_bytes(header)
    with pytest.raises(ModelError, match=r"several \.gguf"):
        resolve_source(str(tmp_path))
    assert resolve_source(str(tmp_path), gguf_file="n.gguf").path.endswith("n.gguf")


@pytest.mark.parametrize(
    "name, words",
    [
        ("", "no model chosen"),
        ("./missing-folder", "does not exist"),
        ("C:\\models\\x", "does not exist"),
        ("not a model id!", "does not exist"),
    ],
)
def test_bad_names_explain_themselves(name, words):
    with pytest.raises(ModelError, match=words) as info:
        resolve_source(name)
    assert info.value.advice


def test_a_plain_file_is_not_a_model(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ModelError, match=r"not a \.gguf"):
        resolve_source(str(path))


def test_offline_hub_model_not_cached_says_how_to_use_a_local_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelError) as info:
        load_model(ModelConfig(name_or_path="hone-studio-tests/no-such-model"), device="cpu")
    assert "cannot be reached" in info.value.message or "no model named" in info.value.message
    assert "local model folder" in info.value.advice or "spelling" in info.value.advice


def test_load_folder_reports_the_model(tiny_model_dir):
    loaded = load_model(ModelConfig(name_or_path=str(tiny_model_dir("tiny-moe-qwen3"))), device="cpu")
    info = loaded.info
    assert (info.model_type, info.layers, info.hidden_size, info.vocab_size) == ("qwen3_moe", 2, 64, 49152)
    assert info.is_moe and info.num_experts == 8 and info.experts_per_token == 2 and not info.is_vision
    assert info.params == sum(p.numel() for p in loaded.model.parameters())
    assert loaded.model.dtype == torch.float32  # auto on CPU
    assert loaded.tokenizer.pad_token is not None


def test_inspect_matches_load_without_reading_weights(tiny_model_dir):
    folder = str(tiny_model_dir("tiny-dense"))
    assert inspect_model(folder) == load_model(ModelConfig(name_or_path=folder), device="cpu").info


def test_dtype_auto_is_float32_on_cpu():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_qlora_on_cpu_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ModelError, match="NVIDIA GPU"):
        load_model(ModelConfig(name_or_path=str(tiny_model_dir("tiny-dense"))), device="cpu", qlora=True)


def test_bundled_gguf_is_converted_once_and_answers(smollm2_tokenizer):
    """The bundled SmolLM2 GGUF loads (converted to a cached safetensors folder), reloads faster from the cache
    with the same weights, and answers a simple question correctly."""
    started = time.perf_counter()
    first = load_model(ModelConfig(name_or_path=DEMO_MODEL), device="cpu", for_training=False)
    first_time = time.perf_counter() - started
    started = time.perf_counter()
    second = load_model(ModelConfig(name_or_path=DEMO_MODEL), device="cpu", for_training=False)
    second_time = time.perf_counter() - started
    assert first.info.model_type == "llama" and first.info.layers == 30 and first.info.source_kind == "bundled"
    assert second_time < first_time or second_time < 5, (first_time, second_time)
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    tok = second.tokenizer
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")  # as the GGUF states (5.17 swaps them)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = second.model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1] :])


def test_a_gguf_not_yet_converted_is_announced_once(tmp_path, monkeypatch):
    """`pending_conversion` names the .gguf a load will convert first (the trainer says so before the minute it
    takes), and nothing once its converted folder exists, nor for other sources."""
    from hone.core.config import ModelConfig
    from hone.core.models import load
    from hone.core.models.load import gguf_conversion_folder, pending_conversion

    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(load, "check_gguf_whole", lambda path: path)  # a stand-in file: only its name matters here
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert pending_conversion(ModelConfig(name_or_path=str(gguf))) == gguf
    converted = gguf_conversion_folder(gguf)
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    assert pending_conversion(ModelConfig(name_or_path=str(gguf))) is None
    assert pending_conversion(ModelConfig(name_or_path=str(tmp_path))) is None  # a folder converts nothing
    assert pending_conversion(ModelConfig(name_or_path=str(tmp_path / "missing.gguf"))) is None  # load reports it


def test_a_hub_model_with_the_hub_unreachable_is_refused_within_seconds(monkeypatch, tmp_path):
    """No network: one TCP probe of the Hub says so at once, instead of the request's 10 s timeout (and the
    retries of a download after it)."""
    import socket
    import time

    from huggingface_hub import constants

    from hone.core.models.load import check_hub_model

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connections are refused
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    began = time.monotonic()
    with pytest.raises(ModelError) as info:
        check_hub_model("hone-studio-tests/no-such-model")
    assert time.monotonic() - began < 3
    assert "hone-studio-tests/no-such-model is not in the local Hugging Face cache" in info.value.message
    assert f"127.0.0.1:{port}" in info.value.message and "cannot be reached" in info.value.message
    assert "local model folder" in info.value.advice

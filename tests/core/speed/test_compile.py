"""Regional compilation of decoder blocks: what is compiled, that it computes the same, that compile time is
measured, and that it comes off again. Dynamo traces with the "eager" backend here (no C++/Triton compiler on
a CPU test machine); the GPU test compiles with inductor."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from hone.core.models.shapes import build_model
from hone.core.speed.compile import compile_blocks, decoder_blocks, uncompile_blocks
from hone.core.speed.fused.apply import apply_kernels, revert_kernels


def _model(layers: int = 2):
    model = build_model("tiny-dense", layers=layers, vocab_size=512)
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def _loss(model, length: int):
    ids = torch.arange(length)[None] % 512
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def test_compile_blocks_compiles_each_layer_once_measures_it_and_reverts():
    model = _model(layers=3)
    blocks = decoder_blocks(model)
    assert [type(b).__name__ for _, b in blocks] == ["Qwen3DecoderLayer"] * 3
    eager = _loss(model, 9).item()
    apply_kernels(model)
    torch._dynamo.reset()
    report = compile_blocks(model, backend="eager")
    try:
        assert report.blocks == 3 and set(report.block_types) == {"Qwen3DecoderLayer"}
        assert all(b._compiled_call_impl is not None for _, b in blocks)
        assert compile_blocks(model, backend="eager") is report  # compiling twice is a no-op
        assert report.take_new_seconds() == 0.0
        loss = _loss(model, 9)
        loss.backward()
        assert abs(loss.item() - eager) < 1e-5, (loss.item(), eager)
        first = report.take_new_seconds()
        assert first > 0 and "compiled in" in report.summary()
        # Layers bind the same swapped-in forwards, so dynamo's guards pass across layers: fewer graphs than
        # layers (layer 0 gets its own only because its input does not require grad).
        assert 1 <= report.compiles < 3, report.compiles
        _loss(model, 9).backward()
        assert report.take_new_seconds() == 0.0, "the same shape compiled again"
        assert report.compile_seconds == first
    finally:
        assert uncompile_blocks(model) == 3
        revert_kernels(model)
    assert all(b._compiled_call_impl is None for _, b in blocks)
    assert uncompile_blocks(model) == 0
    assert abs(_loss(model, 9).item() - eager) < 1e-6

"""The language model of a packed vision family runs Hone's packed attention (the batch's cu_seqlens, no dense
mask per layer) while the vision encoder keeps transformers' own; packed mixed rows then give the loss and
gradients of each row run alone."""

from __future__ import annotations

import pytest
from test_vision_batches import assert_batched_equals_rows_alone, collator, encode
from vision_helpers import PACKED_KINDS

from hone.core.config import SpeedConfig
from hone.core.speed import attention


@pytest.mark.parametrize("backend", ["rows", "sdpa"])
@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_packed_attention_on_the_language_model_equals_rows_one_by_one(kind, backend, vision_kit, mixed_rows):
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    tokenized = encode(processor, folder, rows)
    choice = attention.configure(model, SpeedConfig(attention="auto" if backend == "rows" else backend), "cpu")
    try:
        assert choice.name == backend, choice.reason
        assert "language model" in choice.reason
        text, vision = attention.language_and_vision_configs(model)
        assert text._attn_implementation == choice.implementation
        assert vision._attn_implementation == choice.previous  # the image encoder keeps its own attention
        make = collator(processor, model, packing=True)
        assert "cu_seq_lens_q" in make.collate(tokenized).model_inputs()
        assert "Hone's packed attention, no mask" in make.describe() and "block-diagonal" not in make.describe()
        assert_batched_equals_rows_alone(kind, model, make, tokenized)
    finally:
        attention.revert(model, choice)


@pytest.mark.parametrize("kind", PACKED_KINDS)
def test_without_hone_attention_the_batch_carries_no_text_attention_kwargs(kind, vision_kit):
    """transformers' own attention (speed.attention = hf) finds sequence starts from the position ids; the packed
    metadata would only reach the image encoder."""
    processor, model = vision_kit(kind)
    choice = attention.configure(model, SpeedConfig(attention="hf"), "cpu")
    assert choice.name == "hf"
    make = collator(processor, model, packing=True)
    assert make.text_attention_kwargs is False
    assert "block-diagonal mask" in make.describe()


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_the_image_encoder_on_varlen_with_the_language_model_packed(kind, vision_kit, mixed_rows, monkeypatch):
    """Both at once, as on a GPU: the language model's packed kwargs (cu_seq_lens_q ...) do not reach the image
    encoder, which takes its own cu_seqlens (torch's varlen kernel replaced by a per-segment reference here); packed
    mixed rows still give each row's loss and gradients run alone."""
    from torch.nn.attention import varlen

    from hone.core.speed.attention import vision_encoder
    from tests.helpers.packed import bidirectional_varlen

    monkeypatch.setattr(varlen, "varlen_attn", bidirectional_varlen)
    processor, model = vision_kit(kind)
    folder, rows = mixed_rows
    tokenized = encode(processor, folder, rows)
    choice = attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    previous = vision_encoder.apply_encoder_attention(model)
    try:
        assert choice.name == "rows" and previous is not None
        make = collator(processor, model, packing=True)
        assert "cu_seq_lens_q" in make.collate(tokenized).model_inputs()
        assert_batched_equals_rows_alone(kind, model, make, tokenized)
    finally:
        vision_encoder.revert_encoder_attention(model, previous)
        attention.revert(model, choice)

"""The planner's arithmetic against sizes worked out by hand, and how each lever moves the peak."""

from __future__ import annotations

import dataclasses

import pytest

from hone.core.memory.estimate import GIB, NF4_BYTES, PROJECTION_RECOMPUTE_TOKENS, MemorySettings, estimate_peak
from hone.core.memory.shape import ModelShape
from hone.core.models.shapes import make_config

# 2 layers, hidden 64, MLP 128, 4 query heads and 2 key/value heads of 16, vocabulary 1000, untied head.
SMALL = ModelShape(
    layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=1000, tied_embeddings=False
)


def test_parameter_counts_by_hand():
    # q 64x64, k and v 64x32 each, o 64x64; gate, up, down 64x128 each
    assert SMALL.attention_params == 64 * 64 + 2 * 64 * 32 + 64 * 64 == 12288
    assert SMALL.linear_params == 2 * (12288 + 3 * 64 * 128) == 73728
    assert SMALL.table_params == 2 * 1000 * 64
    # LoRA r4 on q (64+64), k, v (64+32 each), o (64+64), gate, up, down (64+128 each)
    assert SMALL.lora_params(4) == 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))


def test_small_peak_by_hand():
    settings = MemorySettings(
        batch_tokens=512,
        lora_rank=4,
        checkpoint="gpu",
        host_embeddings=False,
        host_lm_head=False,
        tiled_mlp=False,
        chunked_loss=False,
    )
    estimate = estimate_peak(SMALL, settings)
    trainable = SMALL.lora_params(4)
    assert estimate.part("weights") == 73728 * 2
    assert estimate.part("vocabulary tables") == 2 * 1000 * 64 * 2
    assert estimate.part("LoRA + optimizer") == trainable * 12  # fp32 weight + two fp32 Adam moments
    assert estimate.part("checkpoints") == 2 * 512 * 64 * 2  # each layer's input, bf16
    # the backward of a recomputed layer: LoRA gradients, two hidden-size tensors, the attention half's saved
    # tensors (3 x hidden + 3 x (q + kv) widths), flash's workspace (8 bytes per query value + dq, dk, dv) and the
    # untiled MLP (6 tensors of the intermediate width)
    backward = (
        trainable * 4
        + 2 * 512 * 64 * 2
        + 512 * 2 * (3 * 64 + 3 * (64 + 32))
        + 512 * 64 * 8
        + 512 * (64 + 64) * 2
        + 512 * 2 * 6 * 128
    )
    # the plain loss: every logit in fp32 plus its bf16 copy and gradient, and the final hidden states
    loss = 512 * 1000 * (4 + 4) + 512 * 64 * 2
    assert estimate.phase == "loss" and estimate.part("step") == loss > backward
    live = sum(p.bytes for p in estimate.parts if p.name != "allocator slack")
    assert estimate.peak_bytes == pytest.approx(live * 1.04)


def test_qwen3_8b_defaults_match_the_measured_composition():
    """docs/performance/memory.md: 13.74 GiB allocated before the step with the defaults (12.94 of bf16 decoder
    weights, 0.16 LoRA, 0.33 Adam, 0.25 reload buffers), the peak 16.74 GiB in a layer's no-grad forward."""
    shape = ModelShape.from_config(make_config("dense-8b"))
    estimate = estimate_peak(shape, MemorySettings(batch_tokens=16384))
    assert estimate.part("weights") / GIB == pytest.approx(12.94, abs=0.01)
    assert estimate.part("LoRA + optimizer") / GIB == pytest.approx(0.16 + 0.33, abs=0.01)
    assert estimate.part("checkpoints") / GIB == pytest.approx(0.25, abs=0.001)
    assert estimate.phase == "forward"
    assert estimate.peak_gib == pytest.approx(16.74, rel=0.10)


@pytest.mark.parametrize(
    ("change", "smaller"),
    [
        ({"qlora": True}, True),
        ({"optimizer": "adamw8bit"}, True),
        ({"checkpoint": "gpu"}, False),
        ({"host_lm_head": False}, False),
        ({"tiled_mlp": False}, False),
        ({"batch_tokens": 4096}, True),
    ],
)
def test_each_lever_moves_the_peak_the_right_way(change, smaller):
    shape = ModelShape.from_config(make_config("dense-8b"))
    base = MemorySettings(batch_tokens=16384)
    before, after = estimate_peak(shape, base).peak_bytes, estimate_peak(shape, dataclasses.replace(base, **change))
    assert (after.peak_bytes < before) is smaller


def test_large_batches_save_one_q_and_one_kv_width_fewer_in_a_recomputed_layer():
    """From PROJECTION_RECOMPUTE_TOKENS the trainer runs the head-normed q/k projections again in backward (not
    under torch.compile): the backward holds (q + kv) x 2 bytes a token less."""
    from hone.core.speed.checkpointing.projection_recompute import RECOMPUTE_TOKENS

    assert PROJECTION_RECOMPUTE_TOKENS == RECOMPUTE_TOKENS
    shape = ModelShape.from_config(make_config("dense-8b"))
    q_kv = (32 + 8) * 128 * 2
    for tokens, fewer in ((RECOMPUTE_TOKENS - 8, 0), (RECOMPUTE_TOKENS, 1), (409_600, 1)):
        settings = MemorySettings(batch_tokens=tokens)
        on, off = (
            estimate_peak(shape, dataclasses.replace(settings, projection_recompute=flag)) for flag in (True, False)
        )
        assert on.phase == off.phase == "backward"
        assert off.part("step") - on.part("step") == fewer * tokens * q_kv


def test_kept_layers_hold_their_activations_through_the_loss_not_through_a_recompute():
    """speed.keep_layer_activations: the last K layers save no input to recompute from but all their activations,
    alive at the loss and in their own backward; the recomputed layers' backward comes after they are freed."""
    settings = MemorySettings(
        batch_tokens=512, lora_rank=4, checkpoint="gpu", host_embeddings=False, host_lm_head=False, tiled_mlp=False
    )
    none, one = (estimate_peak(SMALL, dataclasses.replace(settings, kept_layers=k)) for k in (0, 1))
    # one layer's activations by hand: 3 hidden-size tensors, q/k/v before and after norm and rope with the
    # attention output (3 x (q + kv)), and the MLP's: Hone's fused GLU saves gate and up and the down projection
    # its input (3 x intermediate); plain torch also saves the activation (4 x intermediate); bf16
    activations = 512 * 2 * (3 * 64 + 3 * (64 + 32) + 3 * 128)
    assert one.part("checkpoints") == none.part("checkpoints") - 512 * 64 * 2  # one input fewer saved
    assert one.part("kept activations") == activations and none.part("kept activations") == 0
    plain = estimate_peak(SMALL, dataclasses.replace(settings, kept_layers=1, kernels=False))
    assert plain.part("kept activations") == activations + 512 * 2 * 128
    assert one.phase in ("loss", "kept layers' backward") and none.phase == "loss"
    # every layer kept in an offload mode: nothing is offloaded, nothing is reloaded from the host
    from hone.core.memory.estimate import estimate_host, offloaded_layers

    offload = dataclasses.replace(settings, checkpoint="offload", kept_layers=2)
    assert offloaded_layers(SMALL, offload) == 0 and estimate_host(SMALL, offload).part("offloaded checkpoints") == 0
    assert offloaded_layers(SMALL, dataclasses.replace(offload, kept_layers=1)) == 1
    # under "off" every layer's activations are checkpoints already: the count changes nothing
    off = dataclasses.replace(settings, checkpoint="off")
    assert estimate_peak(SMALL, off) == estimate_peak(SMALL, dataclasses.replace(off, kept_layers=2))


def test_qlora_weights_are_nf4():
    shape = ModelShape.from_config(make_config("dense-8b"))
    estimate = estimate_peak(shape, MemorySettings(batch_tokens=4096, qlora=True))
    assert estimate.part("weights") == pytest.approx(shape.linear_params * NF4_BYTES)


def test_moe_shape_from_config():
    shape = ModelShape.from_config(make_config("moe-qwen3", 8))
    assert (shape.experts, shape.top_k, shape.expert_intermediate, shape.moe_layers) == (128, 8, 768, 8)
    # every expert's weights count; the router too
    assert shape.mlp_params(True) == 128 * 3 * 2048 * 768 + 2048 * 128


def test_vision_config_uses_its_language_model():
    text = make_config("dense-0.6b").to_dict()
    shape = ModelShape.from_config({"model_type": "qwen2_5_vl", "text_config": text})
    assert (shape.layers, shape.hidden) == (28, 1024)


def test_the_llama_3_1_8b_shape_has_its_published_size():
    """The shape `hone bench llama-8b` builds (the one Unsloth's published 342K-token context is for): 8.03 B
    parameters, 32 layers of 4,096 with an untied 128,256-token vocabulary."""
    shape = ModelShape.from_config(make_config("llama-8b"))
    assert (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads) == (32, 4096, 14336, 32, 8)
    assert (shape.linear_params + shape.table_params) / 1e9 == pytest.approx(8.03, abs=0.005)
    assert not shape.tied_embeddings

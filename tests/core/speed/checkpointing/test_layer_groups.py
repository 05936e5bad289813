"""Checkpointed layers back-propagated a group of whole sequences at a time give the gradients of whole layers."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.data.batch_lengths import register_batch
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.speed.checkpointing.checkpointer import apply_checkpointing, decoder_layers, revert_checkpointing
from hone.core.speed.checkpointing.layer_groups import auto_group_tokens, group_sequences, groups_for
from tests.helpers.offload import layer_call_counter, lora_model, loss_and_grads, packed_batch

LENGTHS = [23, 41, 9, 30, 5]  # groups of 40 tokens: [23] [41] (longer than a group: alone) [9, 30] [5]


def test_sequences_are_grouped_whole_and_in_order():
    assert group_sequences(LENGTHS, 40) == [(0, 1), (1, 2), (2, 4), (4, 5)]
    assert group_sequences([10, 10, 10], 30) == [(0, 3)]
    assert group_sequences([10, 10, 10], 20) == [(0, 2), (2, 3)]
    assert group_sequences([50], 8) == [(0, 1)]
    assert group_sequences([], 8) == []


def test_each_group_gets_offsets_from_zero_and_its_longest_sequence():
    cu = torch.tensor([0, 23, 64, 73, 103, 108], dtype=torch.int32)
    register_batch(cu, LENGTHS)
    groups = groups_for(cu, 40)
    assert [(t.start, t.end, t.max_len) for t in groups] == [(0, 23, 23), (23, 64, 41), (64, 103, 30), (103, 108, 5)]
    assert [t.cu_seqlens.tolist() for t in groups] == [[0, 23], [0, 41], [0, 9, 39], [0, 5]]
    assert groups_for(cu, 40) is groups, "built once per batch and group size"
    assert groups_for(cu.clone(), 40) is None, "a batch that was never registered is not grouped"


def test_group_size_follows_the_hidden_size():
    assert auto_group_tokens(4096) == 4096
    assert auto_group_tokens(1024) == 16384
    assert auto_group_tokens(1 << 20) == 1024  # never below the GEMM-friendly minimum


@pytest.fixture(scope="module")
def models():
    made = {}

    def get(shape, backend="sdpa", dropout=0.0):
        key = (shape, backend, dropout)
        if key not in made:
            base = build_model(shape)
            if backend != "hf":
                assert attention.configure(base, SpeedConfig(attention=backend), "cpu").name == backend
            made[key] = lora_model(base, dropout=dropout)
        return made[key]

    return get


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe-qwen3"])
def test_layer_backward_in_sequence_groups_gives_the_loss_and_gradients_of_no_checkpointing(shape, models):
    model = models(shape)
    batch = packed_batch(LENGTHS)
    ref_loss, ref = loss_and_grads(model, batch)
    layers = len(decoder_layers(model))
    counts, remove = layer_call_counter(model)
    try:
        for mode in ("gpu", "offload-double"):  # offload modes run their CPU bookkeeping here
            checkpointer = apply_checkpointing(model, mode, "cpu", group_tokens=40)
            counts[0] = 0
            loss, grads = loss_and_grads(model, batch)
            revert_checkpointing(model)
            assert checkpointer.grouped_layers == layers, f"{mode}: every layer's backward should run in groups"
            assert counts[0] == layers + 4 * layers, f"{mode}: one forward and one recompute per group per layer"
            torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
            for name, expected in ref.items():
                torch.testing.assert_close(grads[name], expected, rtol=1e-4, atol=1e-6, msg=f"{mode}: {name}")
    finally:
        remove()


def test_input_gradient_reaches_the_embeddings_through_every_group(models):
    """Layer inputs that need gradients (trainable embeddings) get the gradient of each group's slice."""
    model = models("tiny-dense")
    embed = model.get_input_embeddings()
    embed.weight.requires_grad_(True)
    try:
        batch = packed_batch(LENGTHS)
        _, ref = loss_and_grads(model, batch)
        apply_checkpointing(model, "gpu", "cpu", group_tokens=40)
        _, grouped = loss_and_grads(model, batch)
        revert_checkpointing(model)
    finally:
        embed.weight.requires_grad_(False)
        embed.weight.grad = None
    name = next(n for n in ref if "embed_tokens" in n)
    assert ref[name].abs().sum() > 0
    torch.testing.assert_close(grouped[name], ref[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("backend", "dropout", "why"),
    [
        ("sdpa", 0.1, "LoRA dropout: a group-wise recompute would draw other masks"),
        ("hf", 0.0, "transformers' attention gets a mask over the whole row"),
    ],
)
def test_layers_stay_whole_where_groups_would_change_the_result(backend, dropout, why, models):
    model = models("tiny-llama", backend, dropout)
    batch = packed_batch(LENGTHS)
    ref_loss, ref = loss_and_grads(model, batch)
    checkpointer = apply_checkpointing(model, "gpu", "cpu", group_tokens=40)
    loss, grads = loss_and_grads(model, batch)
    revert_checkpointing(model)
    assert checkpointer.grouped_layers == 0, why
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(grads[n], g) for n, g in ref.items())


def test_a_batch_shorter_than_one_group_runs_whole(models):
    model = models("tiny-dense")
    checkpointer = apply_checkpointing(model, "gpu", "cpu", group_tokens=1000)
    loss_and_grads(model, packed_batch(LENGTHS))
    revert_checkpointing(model)
    assert checkpointer.grouped_layers == 0

"""Tiled MLP backward in checkpointed decoder layers (`apply_kernels(tile_mlp=True)`): the same loss and gradients
as plain transformers + peft, the MLP skipped in the recompute and run once per tile in backward instead, and the
cases where it must not apply."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.speed import attention
from hone.core.speed.checkpointing import tiled_mlp
from hone.core.speed.checkpointing.checkpointer import apply_checkpointing, revert_checkpointing
from hone.core.speed.fused.apply import apply_kernels, revert_kernels
from hone.core.train.loss import loss_sum
from tests.helpers.lora import lora_model
from tests.helpers.packed import random_rows

VOCAB = 512
LAYERS = 2
TILE = 16


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 16 tokens for the tiny MLP (intermediate 128), so a 45-token batch makes three tiles."""
    monkeypatch.setattr(tiled_mlp, "TILE_ELEMENTS", 128 * TILE)
    monkeypatch.setattr(tiled_mlp, "MIN_TILE_TOKENS", 1)
    monkeypatch.setattr(tiled_mlp, "TILE_MULTIPLE", 1)


def _model(dropout: float = 0.0):
    return lora_model(vocab=VOCAB, layers=LAYERS, dropout=dropout)


def _mlp_calls(model) -> list[int]:
    calls = [0] * LAYERS
    for index, layer in enumerate(model.get_base_model().model.layers):
        layer.mlp.register_forward_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    return calls


def _step(model):
    batch = collate_packed(random_rows([20, 11, 14], VOCAB, seed=4))  # 45 tokens
    model.train()
    loss = loss_sum(model, batch)
    (loss / 45).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_tiled_mlp_backward_matches_plain_peft_and_skips_the_recompute(small_tiles):
    want_loss, want = _step(_model())  # transformers + peft, no checkpointing, no kernels

    model = _model()
    apply_checkpointing(model, "gpu", "cpu")
    report = apply_kernels(model, tile_mlp=True)
    assert report.count("tiled_mlp") == LAYERS, report.summary()
    calls = _mlp_calls(model)
    got_loss, got = _step(model)

    # Forward once per layer; the recompute skips the MLP; backward runs it once per 16-token tile of 45 tokens.
    assert calls == [1 + 3] * LAYERS, f"MLP calls per layer {calls}, expected 4 (forward + 3 tiles)"
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    assert got.keys() == want.keys() and len(got) == 2 * 7 * LAYERS
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert revert_kernels(model) == sum(report.patched.values())
    revert_checkpointing(model)


def test_layer_groups_and_mlp_tiles_together_match_plain_peft(small_tiles):
    """Layers back-propagated a sequence group at a time ([20], [11, 14] for 25-token groups), each group's MLP in
    16-token tiles."""
    want_loss, want = _step(_model())
    model = _model()
    # Hone's packed attention (transformers' own gets a mask over the whole row, which keeps layers whole).
    attention.configure(model.get_base_model(), SpeedConfig(attention="sdpa"), "cpu")
    checkpointer = apply_checkpointing(model, "gpu", "cpu", group_tokens=25)
    apply_kernels(model, tile_mlp=True)
    calls = _mlp_calls(model)
    got_loss, got = _step(model)
    assert checkpointer.grouped_layers == LAYERS
    # The checkpointed forward runs the MLP in 16-token pieces (3); backward in MLP tiles within each layer group:
    # [20] -> 16 + 4, [11, 14] -> 16 + 9.
    assert calls == [3 + 2 + 2] * LAYERS, calls
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    revert_kernels(model)
    revert_checkpointing(model)


def test_without_tiling_the_recompute_runs_the_mlp(small_tiles):
    model = _model()
    apply_checkpointing(model, "gpu", "cpu")
    assert apply_kernels(model, tile_mlp=False).count("tiled_mlp") == 0
    calls = _mlp_calls(model)
    _step(model)
    assert calls == [2] * LAYERS, calls  # forward + recompute


def test_without_checkpointing_the_mlp_runs_whole(small_tiles):
    model = _model()
    apply_kernels(model, tile_mlp=True)
    calls = _mlp_calls(model)
    _step(model)
    assert calls == [1] * LAYERS, calls


def test_lora_dropout_keeps_the_mlp_whole(small_tiles):
    model = _model(dropout=0.1)
    report = apply_kernels(model, tile_mlp=True)
    assert report.count("tiled_mlp") == 0
    reasons = [reason for reason in report.skipped if reason.startswith("tiled MLP")]
    assert reasons and "dropout" in reasons[0], report.skipped


def test_default_tiles_fit_the_gemms():
    assert tiled_mlp.tile_tokens(12288) == 2560  # Qwen3-8B: 7 tiles of a 16K batch, 60 MiB per bf16 activation
    assert tiled_mlp.tile_tokens(3072) == 10752  # Qwen3-0.6B: 2 tiles
    assert tiled_mlp.tile_tokens(10**6) == tiled_mlp.MIN_TILE_TOKENS


def test_a_checkpointed_forward_over_many_tiles_runs_its_mlp_in_pieces(monkeypatch):
    """Tiles of 4 tokens: the 45-token batch is 12 of them (at least PIECEWISE_MIN_TILES), so the forward runs the
    MLP in pieces without layer groups; the loss and gradients stay plain peft's."""
    monkeypatch.setattr(tiled_mlp, "TILE_ELEMENTS", 128 * 4)
    monkeypatch.setattr(tiled_mlp, "MIN_TILE_TOKENS", 1)
    monkeypatch.setattr(tiled_mlp, "TILE_MULTIPLE", 1)
    want_loss, want = _step(_model())
    model = _model()
    apply_checkpointing(model, "gpu", "cpu")
    apply_kernels(model, tile_mlp=True)
    calls = _mlp_calls(model)
    got_loss, got = _step(model)
    assert calls == [12 + 12] * LAYERS, calls  # forward in 12 pieces, backward in 12 tiles
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    revert_kernels(model)
    revert_checkpointing(model)

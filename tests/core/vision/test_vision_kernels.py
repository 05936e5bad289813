"""Hone's fused kernels on Qwen-VL: norms, gated MLPs (the image encoder's too) and the language model's decoder
adds are fused, and a packed mixed batch gives the loss and gradients of the unfused model."""

from __future__ import annotations

import copy

import pytest
import torch
from test_vision_batches import _grads, collator, encode

from hone.core.speed.fused.apply import apply_kernels, revert_kernels
from hone.core.train.loss import loss_sum


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_fused_language_model_trains_like_the_plain_one(kind, vision_kit, mixed_rows):
    processor, plain = vision_kit(kind)
    fused = copy.deepcopy(plain)
    report = apply_kernels(fused)
    try:
        text_layers = plain.config.text_config.num_hidden_layers
        assert report.patched.get("rms_norm", 0) >= 2 * text_layers + 1, report.summary()
        assert report.patched.get("glu:silu", 0) >= text_layers
        assert report.patched.get("add_rms_norm", 0) == text_layers  # the decoder layers' fused residual adds
        folder, rows = mixed_rows
        tokenized = encode(processor, folder, rows)
        make = collator(processor, plain, packing=True)
        results = []
        for model in (plain, fused):
            model.zero_grad()
            loss = loss_sum(model, make.collate(tokenized), mode="plain")
            loss.backward()
            results.append((loss.detach(), _grads(model)))
            model.zero_grad()
    finally:
        revert_kernels(fused)
    (loss_plain, grads_plain), (loss_fused, grads_fused) = results
    torch.testing.assert_close(loss_fused, loss_plain, rtol=1e-5, atol=1e-5)
    assert grads_fused.keys() == grads_plain.keys()
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_fused[name], grad, rtol=1e-4, atol=1e-5, msg=name)

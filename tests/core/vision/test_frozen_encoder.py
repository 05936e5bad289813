"""A frozen vision encoder under Hone's activation checkpointing: its blocks (checkpointable layers like the
decoder's) build no autograd graph, so a step runs them once, neither recomputes them nor back-propagates through
them, and the adapters get the gradients of a step without checkpointing."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from test_vision_batches import _grads, collator, encode
from vision_helpers import KINDS

from hone.core.config import LoraConfig as HoneLora
from hone.core.speed.checkpointing.checkpointer import apply_checkpointing, decoder_layers, revert_checkpointing
from hone.core.train.lora import vision_plan
from hone.core.train.loss import loss_sum


def _lora_on_the_language_model(model):
    exclude, _ = vision_plan(model, HoneLora())
    return get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], exclude_modules=exclude)
    )


def _encoder_blocks(model):
    """The vision encoder's checkpointable blocks (GradientCheckpointingLayers under the family's encoder)."""
    from hone.core.vision import family_of

    encoder = set(family_of(model).vision_modules)
    layers = {id(m) for m in decoder_layers(model)}
    return [m for name, m in model.named_modules() if id(m) in layers and encoder & set(name.split("."))]


@pytest.mark.parametrize("kind", KINDS)
def test_frozen_encoder_blocks_run_once_and_the_adapters_train_as_without_checkpointing(kind, vision_kit, mixed_rows):
    processor, tiny_model = vision_kit(kind)
    model = _lora_on_the_language_model(copy.deepcopy(tiny_model))
    folder, rows = mixed_rows
    batch = collator(processor, model.get_base_model(), packing=False).collate(encode(processor, folder, rows))
    assert batch.num_images > 0

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_sum(model, batch, mode="plain")
        loss.backward()
        return loss.detach(), _grads(model)

    blocks = _encoder_blocks(model)
    assert blocks, f"{kind}: no checkpointable encoder block found"
    linears = [m for b in blocks for m in b.modules() if isinstance(m, torch.nn.Linear)]
    runs, outputs = [], []  # encoder linear layers run; whether each block's output requires grad
    hooks = [m.register_forward_pre_hook(lambda *_: runs.append(1)) for m in linears]

    def seen(_module, _args, out):
        outputs.append((out[0] if isinstance(out, tuple) else out).requires_grad)

    hooks += [b.register_forward_hook(seen) for b in blocks]
    try:
        loss_plain, grads_plain = step()
        plain_runs, runs[:] = len(runs), []
        apply_checkpointing(model, "gpu", "cpu")
        try:
            loss, grads = step()
        finally:
            revert_checkpointing(model)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(runs) == plain_runs, (
        f"{kind}: the encoder's layers ran {len(runs)} times, {plain_runs} without "
        "checkpointing (recomputed in backward)"
    )
    assert not any(outputs), f"{kind}: a frozen encoder block's output requires grad"
    torch.testing.assert_close(loss, loss_plain, rtol=1e-6, atol=0)
    assert grads.keys() == grads_plain.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_plain[name], rtol=1e-5, atol=1e-7, msg=name)

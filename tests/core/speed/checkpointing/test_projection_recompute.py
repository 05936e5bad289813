"""q/k projections run again for their head norms' backward (projection_recompute.py), on the CPU in float32 with
tiny Qwen3 models: the same loss and LoRA gradients as keeping them, the outputs really gone between the recompute
and the backward, the threshold, dropout and models without head norms left alone."""

from __future__ import annotations

import gc
import weakref

import torch

from hone.core.config import SpeedConfig
from hone.core.models.shapes import build_model
from hone.core.speed.checkpointing.checkpointer import apply_checkpointing, decoder_layers, revert_checkpointing
from hone.core.speed.checkpointing.projection_recompute import projections, recomputed_projections
from tests.helpers.offload import lora_model, loss_and_grads, packed_batch


def _qwen3(dropout: float = 0.0):
    from hone.core.speed import attention

    base = build_model("tiny-dense")
    assert attention.configure(base, SpeedConfig(attention="sdpa"), "cpu").name == "sdpa"
    return lora_model(base, dropout=dropout)


def _projection_calls(model):
    """(calls per projection kind, remove): counts every q_proj / k_proj forward, recipes' included."""
    calls = {"q_proj": 0, "k_proj": 0}
    handles = []

    def count(kind):
        return lambda module, args, output: calls.__setitem__(kind, calls[kind] + 1)

    for name, module in model.named_modules():
        kind = name.rpartition(".")[2]
        if kind in calls:
            handles.append(module.register_forward_hook(count(kind)))
    return calls, lambda: [h.remove() for h in handles]


def test_projections_are_found_only_beside_head_norms():
    qwen3, llama = build_model("tiny-dense"), build_model("tiny-llama")
    layer = decoder_layers(qwen3)[0]
    assert projections(layer) == (layer.self_attn.q_proj, layer.self_attn.k_proj)
    assert all(projections(layer) == () for layer in decoder_layers(llama))  # no q_norm / k_norm


def test_a_layer_fsdp_splits_is_left_alone():
    """`fully_shard` gives the layer a class deriving from FSDPModule, as here: its projections are not rerun."""
    from torch.distributed.fsdp import FSDPModule

    layer = decoder_layers(build_model("tiny-dense"))[0]
    assert len(projections(layer)) == 2
    layer.__class__ = type("FSDPQwen3DecoderLayer", (FSDPModule, type(layer)), {})
    assert projections(layer) == ()


def test_recomputed_projections_give_the_loss_and_gradients_of_kept_ones():
    model = _qwen3()
    batch = packed_batch([23, 41, 9])
    layers = len(decoder_layers(model))
    checkpointer = apply_checkpointing(model, "gpu", "cpu")
    calls, remove = _projection_calls(model)
    try:
        ref_loss, ref = loss_and_grads(model, batch)
        assert calls == {"q_proj": 2 * layers, "k_proj": 2 * layers}  # forward, recompute
        checkpointer.projection_recompute_tokens = batch.num_tokens
        calls.update(q_proj=0, k_proj=0)
        loss, grads = loss_and_grads(model, batch)
        # and once more in backward, for the norm (the HF norm in float32 saves its input twice: two recipes)
        assert calls["q_proj"] > 2 * layers and calls["k_proj"] > 2 * layers
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
        assert ref.keys() == grads.keys()
        for name, want in ref.items():
            torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-7, msg=name)
        checkpointer.projection_recompute_tokens = batch.num_tokens + 1  # a smaller batch than the threshold
        calls.update(q_proj=0, k_proj=0)
        loss_and_grads(model, batch)
        assert calls == {"q_proj": 2 * layers, "k_proj": 2 * layers}
    finally:
        remove()
        revert_checkpointing(model)


def _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from: int) -> list[bool]:
    """Run one layer's forward under `recomputed_projections`; whether each projection output's memory (the tensor
    owning it) is still alive after."""
    outputs: list[weakref.ref] = []

    def remember(module, args, output):
        outputs.append(weakref.ref(output if output._base is None else output._base))

    handles = [p.register_forward_hook(remember) for p in projections(layer)]
    try:
        with recomputed_projections(layer, hidden.shape[1], enabled_from):
            out = layer(hidden, **kwargs)
        gc.collect()
        alive = [ref() is not None for ref in outputs]
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return alive


def _layer_inputs(model, tokens: int):
    base = model.get_base_model().model
    hidden = torch.randn(1, tokens, base.config.hidden_size, requires_grad=True)
    positions = torch.arange(tokens)[None]
    kwargs = dict(position_embeddings=base.rotary_emb(hidden, positions), position_ids=positions, attention_mask=None)
    return hidden, kwargs


def test_the_outputs_are_not_kept_between_the_recompute_and_its_backward():
    model = _qwen3()
    model.train()
    layer = decoder_layers(model)[0]
    hidden, kwargs = _layer_inputs(model, 12)
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=0) == [True, True]
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=12) == [False, False]
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=13) == [True, True]


def _returning(projection, shape_output):
    original = projection.forward
    projection.forward = lambda x: shape_output(original(x))


def test_an_output_viewed_from_the_gemms_2d_result_is_recognised_and_a_slice_of_a_larger_one_is_not():
    """Hone's LoRA kernel returns its (T, out) GEMM result viewed as (1, T, out): the recipe is for the memory's
    owner. An output that is only part of a larger tensor (q of a fused qkv GEMM) keeps that tensor alive anyway."""
    model = _qwen3()
    model.train()
    layer = decoder_layers(model)[0]
    hidden, kwargs = _layer_inputs(model, 12)
    want = _layer_grads(layer, hidden, kwargs)
    for projection in projections(layer):
        _returning(projection, lambda y: y.reshape(-1, y.shape[-1]).clone().view(y.shape))
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=1) == [False, False]
    got = _layer_grads(layer, hidden, kwargs, enabled_from=1)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    for projection in projections(layer):
        _returning(projection, lambda y: torch.cat([y, y])[:1])
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=1) == [True, True]


def _layer_grads(layer, hidden, kwargs, enabled_from: int = 0) -> dict[str, torch.Tensor]:
    layer.zero_grad(set_to_none=True)
    with recomputed_projections(layer, hidden.shape[1], enabled_from):
        out = layer(hidden, **kwargs)
    (out[0] if isinstance(out, tuple) else out).square().sum().backward()
    return {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}


def test_projections_that_draw_dropout_are_kept():
    """Run again, LoRA's dropout would draw another mask: such a projection keeps its output."""
    model = _qwen3(dropout=0.1)
    model.train()
    layer = decoder_layers(model)[0]
    hidden, kwargs = _layer_inputs(model, 12)
    assert _outputs_alive_after_forward(model, layer, hidden, kwargs, enabled_from=1) == [True, True]


def test_a_recipe_that_no_longer_matches_its_forward_says_so():
    model = _qwen3()
    layer = decoder_layers(model)[0]
    hidden, kwargs = _layer_inputs(model, 8)
    with recomputed_projections(layer, 8, 1):
        out = layer(hidden, **kwargs)
    projection = layer.self_attn.q_proj
    original = projection.forward
    # run again, the projection lays its output out otherwise (as a changed kernel could): refused, not reshaped
    projection.forward = lambda x: original(x).transpose(1, 2).contiguous().transpose(1, 2)
    try:
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    except RuntimeError as exc:
        assert "recomputed for a head norm's backward" in str(exc) and "strides" in str(exc)
    else:
        raise AssertionError("a recipe whose projection changed its layout must not be used silently")

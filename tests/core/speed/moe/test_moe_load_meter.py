"""Tokens per expert per step: the meter's counts equal a bincount of the routers' own top-k choices."""

from __future__ import annotations

import torch
from moe_testing import token_batch

from hone.core.speed import moe


def _router_counts(model, run) -> torch.Tensor:
    """Per-layer bincount of top-k expert ids, read from each router's output (independent of the meter)."""
    layers = model.model.layers
    counts = torch.zeros(len(layers), layers[0].mlp.experts.num_experts, dtype=torch.int64)
    handles = []
    for i, layer in enumerate(layers):

        def hook(module, args, output, i=i):
            if module.training and torch._C._current_graph_task_id() == -1:
                counts[i] += torch.bincount(output[2].reshape(-1), minlength=counts.shape[1])

        handles.append(layer.mlp.gate.register_forward_hook(hook))
    run()
    for h in handles:
        h.remove()
    return counts


def test_counts_match_the_routers_and_reset(tiny_moe_cache):
    model = tiny_moe_cache("tiny-moe-qwen3")
    moe.configure(model, "torch")
    meter = moe.ExpertLoadMeter(model)
    ids = token_batch(seed=5)
    model.train()

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        model(input_ids=ids[:, :5], labels=ids[:, :5]).loss.backward()  # a second micro-batch adds up

    expected = _router_counts(model, step)
    assert expected.sum().item() == 2 * (ids.numel() + ids[:, :5].numel()) * 2  # 2 layers x top-2
    assert meter.read_and_reset(per_layer=True) == expected.tolist()
    assert meter.read_and_reset() == [0] * 5


def test_eval_forwards_and_checkpoint_recompute_are_not_counted(tiny_moe_cache):
    model = tiny_moe_cache("tiny-moe-gptoss")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    moe.configure(model, "torch")  # Hone's autograd function under checkpoint recompute
    meter = moe.ExpertLoadMeter(model)
    ids = token_batch(seed=6)
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    assert meter.read_and_reset() == [0] * 5
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()  # the layers' forwards run twice with checkpointing
    assert sum(meter.read_and_reset()) == ids.numel() * 2 * 2  # tokens x top-2 x 2 layers, once
    meter.close()
    model(input_ids=ids, labels=ids).loss.backward()
    assert sum(meter.read_and_reset()) == 0

"""Tiny Qwen3-MoE, gpt-oss and Qwen2-MoE (shared expert) models trained a few steps with LoRA on attention and
experts: every Hone backend gives the losses and LoRA weights of transformers' eager experts with peft."""

from __future__ import annotations

import pytest
import torch
from moe_testing import MOE_SHAPES, add_lora, token_batch

from hone.core.speed import moe

STEPS = 3


def _train(model, backend: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    peft_model = add_lora(model, random_b=False)  # peft's own init: B = 0, so training must move it
    if backend == "eager":
        moe.apply_backend(peft_model, "eager")
    else:
        moe.install_split_lora(peft_model)
        assert moe.configure(peft_model, backend).name == backend
    params = [p for p in peft_model.parameters() if p.requires_grad]
    # SGD: weight differences stay proportional to gradient differences (Adam would amplify float noise in
    # near-zero gradients into full-size steps).
    optimizer = torch.optim.SGD(params, lr=2.0)
    ids = token_batch(seed=2)
    losses = []
    for _ in range(STEPS):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    lora = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n and "experts" in n}
    return losses, lora


@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_training_steps_match_eager_with_peft(shape, tiny_moe_cache):
    ref_losses, ref_lora = _train(tiny_moe_cache(shape), "eager")
    assert ref_losses[-1] < ref_losses[0] - 1e-3, f"the reference run did not learn: {ref_losses}"
    assert len(ref_lora) == 8  # 2 layers x (gate_up, down) x (A, B)
    for backend in ("torch", "grouped_mm"):
        losses, lora = _train(tiny_moe_cache(shape), backend)
        assert losses == pytest.approx(ref_losses, rel=1e-5), f"{shape} on {backend}: {losses} vs {ref_losses}"
        worst = max(((lora[n] - ref).abs().max() / ref.abs().max()).item() for n, ref in ref_lora.items())
        assert worst < 1e-4, f"{shape} on {backend}: expert LoRA weights differ by {worst:.3g} after {STEPS} steps"

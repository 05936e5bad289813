"""The fused router (`hone.core.speed.moe.fused_router`): which routers qualify, and that a patched router gives peft's
outputs and gradients (torch path, and the Triton kernels under the interpreter), and reverts."""

from __future__ import annotations

import pytest
import torch
from moe_testing import token_batch
from peft import LoraConfig, get_peft_model

from hone.core.speed.fused.apply import apply_kernels, revert_kernels
from hone.core.speed.moe.fused_router import router_reason


def _router_lora(tiny_moe_cache, shape: str, seed: int = 1):
    """peft LoRA on the router weight (peft's target_parameters, as "all-linear" adds it on Qwen3-MoE)."""
    model = tiny_moe_cache(shape)
    router = "mlp.router.weight" if shape == "tiny-moe-gptoss" else "mlp.gate.weight"
    torch.manual_seed(seed)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8.0, target_modules=["q_proj"], target_parameters=[router])
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero; a nonzero B makes the router's LoRA visible
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return peft_model


def _routers(peft_model):
    return [m for name, m in peft_model.named_modules() if type(m).__name__ == "ParamWrapper"]


def _loss_and_grads(peft_model, ids):
    peft_model.zero_grad(set_to_none=True)
    out = peft_model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}
    return out.loss.detach(), grads


@pytest.mark.parametrize("interpret", [False, True])
def test_patched_router_gives_pefts_loss_and_gradients(tiny_moe_cache, monkeypatch, interpret):
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")
    peft_model = _router_lora(tiny_moe_cache, "tiny-moe-qwen3")
    ids = token_batch()
    want_loss, want_grads = _loss_and_grads(peft_model, ids)

    report = apply_kernels(peft_model)
    assert report.count("router") == 2, report.summary()  # one per layer
    assert all("forward" in m.__dict__ for m in _routers(peft_model))
    got_loss, got_grads = _loss_and_grads(peft_model, ids)
    torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
    assert set(got_grads) == set(want_grads) and any("gate" in n and "lora_A" in n for n in got_grads)
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, atol=2e-5, rtol=2e-4, msg=lambda m, n=name: f"{n}: {m}")

    revert_kernels(peft_model)
    assert not any("forward" in m.__dict__ for m in _routers(peft_model))


def test_a_router_with_another_rule_is_left_to_peft(tiny_moe_cache):
    # gpt-oss takes the top-k of the logits (with a bias) before its softmax
    peft_model = _router_lora(tiny_moe_cache, "tiny-moe-gptoss")
    (router,) = _routers(peft_model)[:1]
    assert router_reason(router) is not None
    report = apply_kernels(peft_model)
    assert report.count("router") == 0
    assert not any("forward" in m.__dict__ for m in _routers(peft_model))


def test_disabled_adapter_falls_back_to_pefts_forward(tiny_moe_cache):
    peft_model = _router_lora(tiny_moe_cache, "tiny-moe-qwen3")
    ids = token_batch()
    apply_kernels(peft_model)
    with peft_model.disable_adapter(), torch.no_grad():
        got = peft_model(input_ids=ids).logits
    revert_kernels(peft_model)
    with peft_model.disable_adapter(), torch.no_grad():
        want = peft_model(input_ids=ids).logits
    torch.testing.assert_close(got, want)

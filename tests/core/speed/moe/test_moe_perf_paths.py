"""Speed-path choices around the MoE layer: which backend `auto` prefers per GPU generation, the fused silu gate's
switch, and the checkpoint recompute that lets the experts' backward reuse its saved activations."""

from __future__ import annotations

import pytest
import torch
from moe_testing import add_lora, build_tiny_moe, token_batch

from hone.core.speed import moe
from hone.core.speed.checkpointing import checkpointer
from hone.core.speed.moe import choice
from hone.core.speed.moe.experts import expert_weights, find_experts
from hone.kernels.moe.clamped_glu import ClampedGlu


def test_backend_order_prefers_triton_on_hopper_only():
    assert choice.backend_order((9, 0)) == ("triton", "grouped_mm")
    assert choice.backend_order((8, 0)) == ("grouped_mm", "triton")
    assert choice.backend_order((10, 0)) == ("grouped_mm", "triton")
    assert choice.backend_order((7, 0)) == ("grouped_mm",)


@pytest.mark.parametrize(
    ("capability", "failing", "expected"),
    [
        ((9, 0), set(), "triton"),
        ((9, 0), {"triton"}, "grouped_mm"),
        ((8, 6), set(), "grouped_mm"),
        ((8, 6), {"grouped_mm"}, "triton"),
        ((9, 0), {"triton", "grouped_mm"}, "torch"),
    ],
)
def test_auto_takes_the_first_backend_that_passes_its_probe(monkeypatch, capability, failing, expected):
    """`_auto` on a (simulated) CUDA device: probes and capability stubbed, the order and the reasons are real."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(choice, "probe", lambda name, device, dtype: "wrong numbers" if name in failing else None)
    monkeypatch.setattr("hone.kernels.moe.grouped_gemm.launch.triton_runs_on", lambda device: True)
    picked = choice._auto(torch.device("cuda", 0), torch.bfloat16)
    assert picked.name == expected, picked.reason
    for name in failing:
        assert f"{name} failed the probe (wrong numbers)" in picked.reason
    if expected == "triton" and not failing:
        assert "fastest measured on this GPU generation" in picked.reason


def test_fused_gate_follows_the_switch_and_the_activation(monkeypatch):
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    qwen = build_tiny_moe("tiny-moe-qwen3", layers=1)
    gptoss = build_tiny_moe("tiny-moe-gptoss", layers=1)
    moe.configure(qwen, "torch", "cpu")
    moe.configure(gptoss, "torch", "cpu")
    assert all(expert_weights(m).silu_halves for _, m in find_experts(qwen)), "Qwen's silu gate is fused"
    assert not any(expert_weights(m).clamped_glu for _, m in find_experts(qwen))
    modules = [m for _, m in find_experts(gptoss)]
    assert modules and not any(expert_weights(m).silu_halves for m in modules)
    # the constants as the module holds them (a config field in newer transformers, fixed in older ones)
    assert all(expert_weights(m).clamped_glu == ClampedGlu(m.alpha, m.limit) for m in modules), "gpt-oss's too"
    assert all(expert_weights(m).clamped_glu == ClampedGlu(1.702, 7.0) for m in modules)
    moe.configure(qwen, "torch", "cpu", fused_gate=False)
    moe.configure(gptoss, "torch", "cpu", fused_gate=False)
    assert not any(expert_weights(m).silu_halves for _, m in find_experts(qwen))
    assert not any(expert_weights(m).clamped_glu for _, m in find_experts(gptoss))


def test_a_changed_gate_is_not_taken_for_gptoss():
    """An experts module with gpt-oss's constants but another gate (a future release, a remote-code model) keeps its
    own activation."""
    gptoss = build_tiny_moe("tiny-moe-gptoss", layers=1)
    (_, module), *_ = find_experts(gptoss)
    module._apply_gate = lambda gate_up: gate_up[..., ::2] * torch.sigmoid(gate_up[..., 1::2])
    assert expert_weights(module).clamped_glu is None


@pytest.mark.parametrize("fused_gate", [True, False], ids=["fused-gate", "generic-gate"])
def test_checkpoint_recompute_gives_the_gradients_of_a_plain_backward(monkeypatch, fused_gate):
    """Under Hone's recompute checkpointing the experts' backward overwrites its saved gate_up (the recompute's
    graph is used once); the gradients must equal those of the same model without checkpointing."""
    monkeypatch.delenv(moe.ENV_VAR, raising=False)
    ids = token_batch(length=10)
    grads = []
    for checkpointed in (False, True):
        model = add_lora(build_tiny_moe("tiny-moe-qwen3"))
        moe.install_split_lora(model)
        moe.configure(model, "torch", "cpu", fused_gate=fused_gate)
        if checkpointed:
            checkpointer.apply_checkpointing(model, "gpu", "cpu")
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    plain, recomputed = grads
    assert plain.keys() == recomputed.keys() and any("experts" in n for n in plain)
    for name, want in plain.items():
        torch.testing.assert_close(recomputed[name], want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")

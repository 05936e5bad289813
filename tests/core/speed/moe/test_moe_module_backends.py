"""transformers' own experts modules (Qwen3-MoE, gpt-oss, Qwen2-MoE) with peft LoRA on their stacked weights:
each Hone backend with split LoRA against transformers' eager loop with peft's W + BA (the reference), for the
output and the gradients of the input, the routing weights and every LoRA factor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hone.core.models.shapes import make_config
from hone.core.speed.moe import install_split_lora, revert_split_lora
from hone.core.speed.moe.experts import IMPLEMENTATIONS
from hone.kernels.moe.grouped_gemm.launch import interpreting

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}  # relative to the largest value
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EXPERTS, HIDDEN, INTER, TOKENS, TOP_K = 5, 32, 24, 10, 2


def _experts_module(family: str) -> nn.Module:
    if family == "qwen3":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts as cls

        config = make_config("tiny-moe-qwen3", num_experts=EXPERTS, hidden_size=HIDDEN, moe_intermediate_size=INTER)
    elif family == "gptoss":
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts as cls

        config = make_config("tiny-moe-gptoss", num_local_experts=EXPERTS, hidden_size=HIDDEN, intermediate_size=INTER)
    else:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeExperts as cls

        config = make_config("tiny-moe-qwen2", num_experts=EXPERTS, hidden_size=HIDDEN, moe_intermediate_size=INTER)
    module = cls(config)
    gen = torch.Generator().manual_seed(len(family))
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return module


class Block(nn.Module):
    def __init__(self, experts: nn.Module):
        super().__init__()
        self.experts = experts

    def forward(self, hidden, index, weights):
        return self.experts(hidden, index, weights)


def _lora_block(family: str, dtype: torch.dtype, device: str = "cpu") -> Block:
    from peft import LoraConfig, inject_adapter_in_model

    block = Block(_experts_module(family))
    config = LoraConfig(r=3, lora_alpha=6, target_parameters=["experts.gate_up_proj", "experts.down_proj"])
    block = inject_adapter_in_model(config, block)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return block.to(device, dtype)


def _routing():
    gen = torch.Generator().manual_seed(3)
    # expert 2 gets no token
    index = torch.stack([torch.tensor([0, 1, 3, 4])[torch.randperm(4, generator=gen)[:TOP_K]] for _ in range(TOKENS)])
    weights = torch.rand(TOKENS, TOP_K, generator=gen)
    return index, weights / weights.sum(-1, keepdim=True)


def _forward_backward(block: Block, implementation: str, dtype: torch.dtype, device: str = "cpu"):
    block.experts.get_base_layer().config._experts_implementation = implementation
    index, weights = _routing()
    hidden = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(4)).to(device, dtype)
    hidden.requires_grad_(True)
    weights = weights.to(device, dtype).requires_grad_(True)
    out = block(hidden, index.to(device), weights)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device, dtype))
    grads = {"input": hidden.grad, "routing_weights": weights.grad}
    grads |= {name: p.grad for name, p in block.named_parameters() if "lora_" in name}
    return out, grads


def _compare(family: str, backend: str, dtype: torch.dtype, device: str = "cpu") -> None:
    reference_block = _lora_block(family, dtype, device)
    ref_out, ref_grads = _forward_backward(reference_block, "eager", dtype, device)
    block = _lora_block(family, dtype, device)
    assert install_split_lora(block) == 1
    out, grads = _forward_backward(block, IMPLEMENTATIONS[backend], dtype, device)
    assert len(ref_grads) == 6, sorted(ref_grads)  # input, routing weights, A and B of gate_up and down
    tol = TOLERANCE[dtype]
    errors = {"output": ((out.float() - ref_out.float()).abs().max() / ref_out.float().abs().max()).item()}
    for name, ref in ref_grads.items():
        assert grads[name] is not None, f"{name} got no gradient"
        errors[name] = ((grads[name].float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"{family} on {backend} in {dtype}: relative errors above {tol}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("family", ["qwen3", "gptoss", "qwen2"])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_backend_with_split_lora_matches_eager_and_peft(backend, family, dtype):
    _compare(family, backend, dtype)


@pytest.mark.parametrize(
    ("family", "dtype"),
    [("qwen3", torch.bfloat16), ("gptoss", torch.float32)],
    ids=["qwen3-bfloat16", "gptoss-float32"],
)
def test_triton_with_split_lora_matches_eager_and_peft_interpreter(family, dtype):
    if not interpreting():
        pytest.skip("CPU runs need TRITON_INTERPRET=1 at import (tests/kernels/test_moe_triton_cpu.py runs them)")
    _compare(family, "triton", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("family", ["qwen3", "gptoss", "qwen2"])
@pytest.mark.parametrize("backend", ["grouped_mm", "triton", "torch"])
def test_gpu_backend_with_split_lora_matches_eager_and_peft(backend, family, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from hone.core.speed.moe import probe

    if backend != "torch" and (failure := probe(backend, torch.device("cuda", torch.cuda.current_device()), dtype)):
        pytest.skip(f"{backend} does not run in {dtype} on this GPU: {failure}")
    _compare(family, backend, dtype, "cuda")


def test_split_path_never_forms_w_plus_ba_and_revert_restores_peft(monkeypatch):
    from peft.tuners.lora.layer import ParamWrapper

    block = _lora_block("qwen3", torch.float32)
    reference, _ = _forward_backward(_lora_block("qwen3", torch.float32), "eager", torch.float32)

    def refuse(*args, **kwargs):
        raise AssertionError("peft formed W + BA")

    monkeypatch.setattr(ParamWrapper, "get_delta_weight", refuse)
    monkeypatch.setattr(ParamWrapper, "get_delta_factors", refuse)
    install_split_lora(block)
    out, _ = _forward_backward(block, "hone_torch", torch.float32)
    assert torch.allclose(out, reference, atol=1e-5)
    revert_split_lora(block)
    assert type(block.experts) is ParamWrapper
    with pytest.raises(AssertionError, match="peft formed"):
        _forward_backward(block, "hone_torch", torch.float32)


def test_disabled_adapter_gives_the_base_output():
    """peft's disable_adapter context must switch the split LoRA off too."""
    block = _lora_block("gptoss", torch.float32)
    install_split_lora(block)
    plain = _experts_module("gptoss")  # same seed: same base weights, no LoRA
    plain.config._experts_implementation = "eager"
    index, weights = _routing()
    hidden = torch.randn(TOKENS, HIDDEN)
    expected = plain(hidden, index, weights)
    block.experts.get_base_layer().config._experts_implementation = "hone_torch"
    with_lora = block(hidden, index, weights)
    from peft.tuners.tuners_utils import BaseTunerLayer

    for layer in block.modules():
        if isinstance(layer, BaseTunerLayer):
            layer.enable_adapters(False)
    without_lora = block(hidden, index, weights)
    assert torch.allclose(without_lora, expected, atol=1e-5)
    assert not torch.allclose(with_lora, expected, atol=1e-3)


def test_expert_lora_dropout_only_while_training():
    block = _lora_block("qwen3", torch.float32)
    reference = _lora_block("qwen3", torch.float32)
    reference.experts.get_base_layer().config._experts_implementation = "hone_torch"
    install_split_lora(block, dropout=0.5)
    install_split_lora(reference)
    block.experts.get_base_layer().config._experts_implementation = "hone_torch"
    index, weights = _routing()
    hidden = torch.randn(TOKENS, HIDDEN)
    with torch.no_grad():
        block.train()
        first, second = block(hidden, index, weights), block(hidden, index, weights)
        block.eval()
        evaluated = block(hidden, index, weights)
        expected = reference.eval()(hidden, index, weights)
    assert not torch.allclose(first, second, atol=1e-4), "training forwards should drop different LoRA inputs"
    assert torch.allclose(evaluated, expected, atol=1e-6), "eval mode must not drop anything"

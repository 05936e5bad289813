"""The fused LoRA linear under the trainer's autocast: used when autocast's dtype is the input's own (a bf16
model under bf16 autocast, as `StepRunner` runs every CUDA step), with peft's own forward otherwise."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hone.core.fused_lora import patch_lora_layer


def _layer(dtype: torch.dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 24)).to(dtype)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
    layer = model.base_model.model[0]
    torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.1)
    return layer


def _fused(out: torch.Tensor) -> bool:
    """Whether the output comes from the fused LoRA node (through the reshaping views around it)."""
    node = out.grad_fn
    while node is not None and type(node).__name__.startswith(("View", "ToCopy")):
        node = node.next_functions[0][0]
    return node is not None and type(node).__name__ == "LoRALinearFunctionBackward"


def _forward(layer, x):
    out = layer(x)
    grads = torch.autograd.grad(out.float().square().sum(), [x, layer.lora_A["default"].weight,
                                                              layer.lora_B["default"].weight])
    return out, grads


def test_bf16_model_under_bf16_autocast_takes_the_fused_path_with_peft_values():
    peft_layer = _layer(torch.bfloat16)
    fused_layer = copy.deepcopy(peft_layer)
    patch_lora_layer(fused_layer, "0")
    x = torch.randn(6, 32, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_grads = _forward(peft_layer, x)
        got, got_grads = _forward(fused_layer, x)
    assert _fused(got), "the fused node must run under autocast"
    assert not _fused(want)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=2e-2)
    for g, w, name in zip(got_grads, want_grads, ("x", "lora_A", "lora_B"), strict=True):
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2 * w.abs().max().item(), rtol=2e-2,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_autocast_to_another_dtype_keeps_peft_forward():
    """A float32 model under bf16 autocast: autocast would run the base product in bf16, the fused layer in fp32,
    so the layer must leave it to peft."""
    layer = _layer(torch.float32)
    patch_lora_layer(layer, "0")
    x = torch.randn(6, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert not _fused(out)
    assert _fused(layer(x)), "without autocast it is fused"


@pytest.mark.gpu
def test_trainer_autocast_on_cuda_keeps_the_fused_path():
    """What `StepRunner` does on a GPU: bf16 weights, bf16 autocast. Before, any CUDA autocast sent the layer to
    peft's forward (three extra passes over each projection's output per step)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    layer = _layer(torch.bfloat16).cuda()
    patch_lora_layer(layer, "0")
    x = torch.randn(6, 32, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(x)
    assert _fused(out), f"under CUDA bf16 autocast the output came from {type(out.grad_fn).__name__}"

"""The fused LoRA linear under autocast (how the trainer runs a bf16 model on a GPU): it takes over from peft's
forward when autocast computes in the model's dtype, computes what peft computes, and steps aside otherwise.
CPU autocast stands in for CUDA autocast: the code asks autocast about the input's own device."""

from __future__ import annotations

import pytest
import torch

from hone.core.speed.fused import lora_layers
from hone.core.speed.fused.apply import apply_kernels
from tests.helpers.lora import lora_model

VOCAB = 512
LAYERS = 2


def _model(dtype: torch.dtype, dropout: float = 0.0):
    return lora_model(vocab=VOCAB, layers=LAYERS, dropout=dropout, dtype=dtype)


def _loss_and_grads(model, *, autocast_dtype):
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(7))
    pos = torch.cat([torch.arange(15), torch.arange(25)])[None]
    model.train()
    torch.manual_seed(3)  # the same dropout masks for both paths
    with torch.autocast("cpu", dtype=autocast_dtype):
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


class _Counter:
    def __init__(self, monkeypatch):
        self.calls = 0
        original = lora_layers.lora_linear

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(lora_layers, "lora_linear", counted)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_fused_lora_runs_under_matching_autocast_and_matches_peft(monkeypatch, dropout):
    reference = _model(torch.bfloat16, dropout)
    want_loss, want = _loss_and_grads(reference, autocast_dtype=torch.bfloat16)

    fused = _model(torch.bfloat16, dropout)
    assert apply_kernels(fused).count("lora_linear") == 7 * LAYERS
    counter = _Counter(monkeypatch)
    got_loss, got = _loss_and_grads(fused, autocast_dtype=torch.bfloat16)

    assert counter.calls == 7 * LAYERS, f"the fused LoRA linear ran {counter.calls} times, expected {7 * LAYERS}"
    assert abs(got_loss.item() - want_loss.item()) < 2e-2 * abs(want_loss.item()), (got_loss, want_loss)
    assert got.keys() == want.keys() and len(got) == 2 * 7 * LAYERS
    for name, grad in want.items():
        # Both paths are bf16; they round B(A x), its scale and the sum at different places.
        scale = grad.abs().max().item()
        torch.testing.assert_close(got[name], grad, rtol=5e-2, atol=5e-2 * scale, msg=lambda m, n=name: f"{n}: {m}")


def test_fused_lora_steps_aside_when_autocast_would_change_the_dtype(monkeypatch):
    """An fp32 model under bf16 autocast: peft's GEMMs run in bf16 there, so peft's own path runs."""
    reference = _model(torch.float32)
    want_loss, want = _loss_and_grads(reference, autocast_dtype=torch.bfloat16)
    fused = _model(torch.float32)
    apply_kernels(fused)
    counter = _Counter(monkeypatch)
    got_loss, got = _loss_and_grads(fused, autocast_dtype=torch.bfloat16)
    assert counter.calls == 0, "the fused path ran although autocast computes in another dtype"
    assert torch.equal(got_loss, want_loss)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name


def test_lora_outputs_keep_peft_dtype_under_autocast():
    model = _model(torch.bfloat16)
    apply_kernels(model)
    layer = model.get_base_model().model.layers[0].mlp.down_proj
    x = torch.randn(5, layer.in_features, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
        want = type(layer).forward(layer, x)
    assert out.dtype == want.dtype == torch.bfloat16
    assert "LoRALinearFunction" in type(out.grad_fn).__name__ or any(
        "LoRALinearFunction" in type(fn).__name__ for fn, _ in out.grad_fn.next_functions if fn is not None
    )
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)

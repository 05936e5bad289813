"""The fused cross-entropy kernel (`hone.kernels.cross_entropy`) under Triton's interpreter, against float32
autograd of `F.cross_entropy` over post-processed logits, and the chunked loss using it against the torch path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hone.kernels.cross_entropy import cross_entropy_forward_backward, cross_entropy_grad_reference

# Relative to the largest value. bf16 / fp16: the gradient is rounded once to the logits' dtype (the interpreter
# rounds toward zero, a GPU to nearest); the losses are float32 sums.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-5, 1e-2), torch.float16: (1e-5, 2e-3)}  # (loss, grad)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _truth(logits: torch.Tensor, targets: torch.Tensor, scale: float, softcap: float | None):
    """Per-row losses and d(sum of losses)/d logits by float32 autograd."""
    raw = logits.float().requires_grad_(True)
    z = raw * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    losses = F.cross_entropy(z, targets, ignore_index=-100, reduction="none")
    losses.sum().backward()
    return losses.detach(), raw.grad


def _rel(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("scale", "softcap"), [(1.0, None), (0.5, None), (1.0, 30.0)], ids=["plain", "scale", "cap"])
@pytest.mark.parametrize("vocab", [7, 5000])  # 5000: more than one 4096-column block, a ragged last block
def test_kernel_matches_float32_autograd(vocab, scale, softcap, dtype):
    gen = torch.Generator().manual_seed(vocab)
    logits = (4 * torch.randn(6, vocab, generator=gen)).to(dtype)
    targets = torch.tensor([0, vocab - 1, -100, 3 % vocab, -100, vocab // 2])
    want_loss, want_grad = _truth(logits, targets, scale, softcap)
    work = logits.clone()
    losses = cross_entropy_forward_backward(work, targets, scale, softcap)
    loss_tol, grad_tol = TOL[dtype]
    assert losses.dtype == torch.float32 and work.dtype == dtype
    assert _rel(losses, want_loss) <= loss_tol, f"losses {losses} vs {want_loss}"
    assert _rel(work, want_grad) <= grad_tol, f"{dtype} gradient off by {_rel(work, want_grad):.3g}"
    assert losses[2] == 0 and losses[4] == 0 and work[2].abs().max() == 0, "ignored rows give no loss, no gradient"


def test_torch_reference_matches_float32_autograd():
    gen = torch.Generator().manual_seed(1)
    logits, targets = torch.randn(4, 50, generator=gen), torch.tensor([1, -100, 49, 0])
    want_loss, want_grad = _truth(logits, targets, 0.7, 20.0)
    work = logits.clone()
    torch.testing.assert_close(cross_entropy_grad_reference(work, targets, 0.7, 20.0), want_loss)
    torch.testing.assert_close(work, want_grad)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_chunked_loss_with_the_kernel_matches_the_torch_path(softcap):
    """`chunked_head_loss(fused=True)` (kernel, interpreted) against `fused=False`: loss, hidden and head grads."""
    from hone.core.train.loss import chunked_head_loss

    gen = torch.Generator().manual_seed(2)
    head = torch.nn.Linear(16, 300, bias=True)
    hidden = torch.randn(23, 16, generator=gen)
    targets = torch.randint(0, 300, (23,), generator=gen)
    targets[::5] = -100
    results = []
    for fused in (True, False):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        loss = chunked_head_loss(h, targets, head, scale=1.3, softcap=softcap, chunk_tokens=8, fused=fused)
        (2.0 * loss).backward()
        results.append((loss.detach(), h.grad, head.weight.grad.clone(), head.bias.grad.clone()))
    for got, want, name in zip(results[0], results[1], ("loss", "d hidden", "d weight", "d bias"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")

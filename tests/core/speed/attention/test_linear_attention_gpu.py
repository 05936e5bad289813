"""Qwen3-Next on packed rows with flash-linear-attention installed, on a CUDA GPU (`pytest -m gpu`, needs the `fla`
package): transformers runs fla's delta rule over the whole packed row where its probe passes on this GPU (fla
refuses some Triton versions on Hopper), else the torch rule a sequence at a time; Hone's convolution keeps each
sequence to itself; the logits and gradients equal the rows run one by one. fla's kernels round differently from
one call to the next, so the error is judged against what a sequence reaching into the one before costs:
transformers' own convolution on the same packed row."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.models.shapes import build_model
from hone.core.speed import attention
from hone.core.speed.attention import linear_attention
from tests.helpers.packed import random_rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = [70, 7, 131, 33]


def test_packed_qwen3_next_with_flash_linear_attention_installed_equals_rows_one_by_one():
    pytest.importorskip("fla")
    torch.manual_seed(0)
    model = build_model("tiny-moe-qwen3-next", vocab_size=2048, device="cuda").eval()  # no dropout, same routing
    module = __import__(type(linear_attention.gated_deltanet_modules(model)[0]).__module__, fromlist=["_"])
    choice = attention.configure(model, SpeedConfig(), "cuda")
    rule = getattr(module, linear_attention.RULE)
    print(choice.reason)
    assert linear_attention.reads_offsets(rule.__wrapped__), "transformers did not pick flash-linear-attention's rule"
    assert rule.hone_says in choice.reason
    rows = random_rows(LENGTHS, vocab=2048, seed=3)
    alone = _logits_and_grads(model, [{"input_ids": torch.tensor([r.input_ids], device="cuda")} for r in rows])
    inputs = collate_packed(rows).to("cuda").model_inputs()
    packed = _logits_and_grads(model, [inputs])
    swapped = getattr(module, linear_attention.CONV)
    setattr(module, linear_attention.CONV, swapped.__wrapped__)  # transformers' convolution over the whole row
    try:
        leaky = _logits_and_grads(model, [inputs])
    finally:
        setattr(module, linear_attention.CONV, swapped)
    for what in ("logits", "gradients"):
        error, leak = _distance(packed[what], alone[what]), _distance(leaky[what], alone[what])
        print(f"{what}: |packed - one by one| {error:.2e}; with transformers' convolution {leak:.2e}")
        assert leak > 0 and error < 0.1 * leak, (what, error, leak)


def _distance(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def _logits_and_grads(model, calls: list[dict]) -> dict[str, torch.Tensor]:
    """The logits of every token, and the gradients of a sum over tokens (so rows add up to the packed row) for the
    Gated DeltaNet layers' weights."""
    model.zero_grad(set_to_none=True)
    logits = []
    for kwargs in calls:
        out = model(**kwargs).logits[0].float()
        (out.square().sum() * 1e-3).backward()
        logits.append(out.detach())
    grads = [param.grad.flatten() for name, param in model.named_parameters() if ".linear_attn." in name]
    return {"logits": torch.cat(logits), "gradients": torch.cat(grads).clone()}

"""Chunked cross-entropy equals plain cross-entropy in value and gradient, for plain linear heads, wrapped
heads, logit post-processing, real tiny models and peft LoRA models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hone.core.data.collate import collate_packed
from hone.core.models.head import head_plan
from hone.core.train.loss import chunked_head_loss, describe, loss_sum
from tests.helpers.packed import assert_grads_close, grads, model_of, random_rows


def reference(hidden, targets, head, scale=1.0, softcap=None):
    logits = head(hidden).float() * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")


def make_case(n, hidden_size, vocab, seed, bias=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(hidden_size, vocab, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden_size, generator=g) * 0.5)
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=g))
    hidden = torch.randn(n, hidden_size, generator=g).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[::3] = -100
    return head, hidden, targets


def run(fn, head, hidden):
    h = hidden.clone().requires_grad_(True)
    head.zero_grad()
    loss = fn(h)
    (loss * 0.37).backward()  # a scale on the way back, as the trainer's divisor would be
    return loss.detach(), h.grad, {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("vocab", "chunk"), [(37, 1), (37, 7), (1000, 16), (4099, 64), (513, 1000)])
@pytest.mark.parametrize("post", [{}, {"scale": 0.25}, {"softcap": 3.0}, {"scale": 2.0, "softcap": 5.0}])
def test_chunked_linear_head_matches_cross_entropy(vocab, chunk, post):
    head, hidden, targets = make_case(45, 24, vocab, seed=vocab + chunk, bias=vocab == 37)
    want = run(lambda h: reference(h, targets, head, **post), head, hidden)
    got = run(lambda h: chunked_head_loss(h, targets, head, chunk_tokens=chunk, **post), head, hidden)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-6)
    assert got[2].keys() == want[2].keys() == ({"weight", "bias"} if vocab == 37 else {"weight"})
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-4, atol=1e-6)


def test_chunked_bf16_is_as_close_as_plain_bf16():
    head, hidden, targets = make_case(64, 32, 3000, seed=3, dtype=torch.bfloat16)
    exact = reference(hidden.float(), targets, head.float())
    head = head.to(torch.bfloat16)
    plain = reference(hidden, targets, head)
    chunked = chunked_head_loss(hidden, targets, head, chunk_tokens=10)
    assert chunked.dtype == torch.float32
    assert abs(chunked.item() - exact.item()) <= abs(plain.item() - exact.item()) + 1e-2 * abs(exact.item())


def test_chunked_under_autocast_matches_plain_under_autocast():
    """The trainer runs the loss under autocast (fp32 weights, bf16 matmuls): same values and gradients."""
    head, hidden, targets = make_case(40, 32, 700, seed=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = run(lambda h: reference(h, targets, head), head, hidden)
        got = run(lambda h: chunked_head_loss(h, targets, head, chunk_tokens=9), head, hidden)
    torch.testing.assert_close(got[0], want[0], rtol=1e-2, atol=1e-2)
    for a, b in [(got[1], want[1]), (got[2]["weight"], want[2]["weight"])]:
        assert a.dtype == b.dtype == torch.float32
        assert float((a - b).norm() / b.norm()) < 2e-2


def test_frozen_head_gets_no_weight_gradient_and_no_grad_mode_works():
    head, hidden, targets = make_case(20, 8, 50, seed=4)
    head.requires_grad_(False)
    got = run(lambda h: chunked_head_loss(h, targets, head, chunk_tokens=6), head, hidden)
    want = run(lambda h: reference(h, targets, head), head, hidden)
    assert got[2] == {} and head.weight.grad is None
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(
            chunked_head_loss(hidden, targets, head, chunk_tokens=6), want[0], rtol=1e-5, atol=1e-4
        )


def test_chunked_wrapped_head_matches_cross_entropy():
    """A head that is not a plain Linear (here: peft LoRA on the head) takes the per-chunk autograd path."""
    from peft import LoraConfig, get_peft_model

    head, hidden, targets = make_case(33, 16, 300, seed=5)
    wrapper = nn.Sequential()
    wrapper.add_module("lm_head", head)
    peft_model = get_peft_model(wrapper, LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False))
    wrapped = peft_model.base_model.model.lm_head
    assert type(wrapped) is not nn.Linear
    want = run(lambda h: reference(h, targets, wrapped, softcap=4.0), wrapped, hidden)
    got = run(lambda h: chunked_head_loss(h, targets, wrapped, chunk_tokens=8, softcap=4.0), wrapped, hidden)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-6)
    assert set(want[2]) == {"lora_A.default.weight", "lora_B.default.weight"} == set(got[2])
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-llama"])
def test_loss_sum_chunked_equals_plain_on_models(shape):
    """tiny-dense ties the head to the embeddings; both models train every weight here."""
    model = model_of(shape)
    batch = collate_packed(random_rows([11, 6, 17], seed=2, prompt=3))
    want = loss_sum(model, batch, mode="plain")
    want.backward()
    want_grads = grads(model)
    model.zero_grad()
    got = loss_sum(model, batch, mode="chunked", chunk_tokens=5)
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    assert_grads_close(grads(model), want_grads)


def test_loss_sum_chunked_equals_plain_with_lora():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        model_of("tiny-llama"), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    )
    batch = collate_packed(random_rows([9, 14], seed=3))
    want = loss_sum(model, batch, mode="plain")
    want.backward()
    want_grads = grads(model)
    assert want_grads and all("lora_" in name for name in want_grads)
    model.zero_grad()
    got = loss_sum(model, batch)
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    assert_grads_close(grads(model), want_grads)


@pytest.mark.parametrize(
    ("model_type", "kwargs", "expect"),
    [
        ("gemma2", dict(final_logit_softcapping=2.0), "soft-cap 2"),
        ("granite", dict(logits_scaling=4.0), "logit scale 0.25"),
        ("cohere", dict(logit_scale=0.5), "logit scale 0.5"),
    ],
)
def test_logit_post_processing_follows_the_model(model_type, kwargs, expect):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=500,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        **kwargs,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert expect in describe(model)
    batch = collate_packed(random_rows([10, 7], vocab=500, seed=4))
    want = loss_sum(model, batch, mode="plain")
    got = loss_sum(model, batch, chunk_tokens=4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_unknown_logit_setting_falls_back_to_plain():
    model = model_of("tiny-llama")
    model.config.logit_temperature = 0.7
    assert isinstance(head_plan(model), str)
    assert "logit_temperature" in describe(model)
    batch = collate_packed(random_rows([6, 4], seed=5))
    torch.testing.assert_close(loss_sum(model, batch), loss_sum(model, batch, mode="plain"))


def test_no_trained_tokens_gives_zero_with_a_graph():
    model = model_of("tiny-llama")
    batch = collate_packed(random_rows([4, 3], seed=6, prompt=10))
    assert batch.num_trained == 0
    loss = loss_sum(model, batch)
    loss.backward()
    assert loss.item() == 0.0

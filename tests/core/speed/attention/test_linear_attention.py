"""Gated DeltaNet layers on packed rows: transformers' convolution and delta rule, swapped for ones that keep each
packed sequence to itself, equal the rows run one by one (values and gradients); unpacked calls are untouched."""

from __future__ import annotations

import functools

import pytest
import torch

from hone.core.data.batch_lengths import register_batch
from hone.core.speed.attention import linear_attention

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
LENGTHS = [5, 1, 9, 3]


def _offsets(lengths, registered: bool) -> torch.Tensor:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    if registered:
        register_batch(cu, lengths)
    return cu


def _original(name: str):
    function = getattr(qwen3_next, name)
    return (
        getattr(function, "__wrapped__", function)
        if getattr(qwen3_next, "_hone_packed_linear_attention", False)
        else function
    )


@pytest.mark.parametrize("registered", [True, False])
def test_the_packed_convolution_equals_each_sequence_convolved_alone(registered):
    gen = torch.Generator().manual_seed(0)
    channels, kernel = 6, 4
    x = torch.randn(1, channels, sum(LENGTHS), generator=gen, requires_grad=True)
    weight = torch.randn(channels, kernel, generator=gen, requires_grad=True)
    bias = torch.randn(channels, generator=gen, requires_grad=True)
    original = _original(linear_attention.CONV)
    conv = linear_attention.packed_conv(original)

    got = conv(x, weight, bias, activation="silu", cu_seq_lens_q=_offsets(LENGTHS, registered))
    pieces = torch.split(x, LENGTHS, dim=2)
    want = torch.cat([original(p, weight, bias, activation="silu") for p in pieces], dim=2)
    torch.testing.assert_close(got, want)
    grad = torch.randn(got.shape, generator=gen)
    got_grads = torch.autograd.grad(got, (x, weight, bias), grad)
    want_grads = torch.autograd.grad(want, (x, weight, bias), grad)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    whole = original(x, weight, bias, activation="silu")
    assert not torch.allclose(whole, want), "the test must see a sequence's first tokens reach into the one before"


def test_the_delta_rule_runs_a_sequence_at_a_time_and_unpacked_calls_are_untouched():
    gen = torch.Generator().manual_seed(1)
    tokens, heads, dim = sum(LENGTHS), 2, 8
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(3))
    g = -torch.rand(1, tokens, heads, generator=gen)
    beta = torch.rand(1, tokens, heads, generator=gen)
    original = _original(linear_attention.RULE)
    rule = linear_attention.packed_rule(original, native=False)
    assert not linear_attention.reads_offsets(original)  # no flash-linear-attention here

    got, state = rule(
        q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cu_seqlens=_offsets(LENGTHS, registered=True)
    )
    assert state is None
    want, start = [], 0
    for n in LENGTHS:
        rows = slice(start, start + n)
        want.append(
            original(
                q[:, rows], k[:, rows], v[:, rows], g=g[:, rows], beta=beta[:, rows], use_qk_l2norm_in_kernel=True
            )[0]
        )
        start += n
    torch.testing.assert_close(got, torch.cat(want, dim=1))
    plain = rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(plain[0], original(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0])


def _kernel_behind(torch_function, kernel):
    """A stand-in for transformers' kernel-or-fallback wrapper with flash-linear-attention behind it."""
    is_new_implementation, package = True, "fla"

    @functools.wraps(torch_function)
    def wrapped(*args, **kwargs):
        assert is_new_implementation and package == "fla" and torch_function  # closed over as transformers does
        return kernel(*args, **kwargs)

    return wrapped


def _delta_rule_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    tokens, heads, dim = sum(LENGTHS), 2, 8
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(3))
    return dict(
        query=q,
        key=k,
        value=v,
        g=-torch.rand(1, tokens, heads, generator=gen),
        beta=torch.rand(1, tokens, heads, generator=gen),
        use_qk_l2norm_in_kernel=True,
    )


def test_an_installed_kernel_that_fails_its_probe_is_not_used_for_packed_or_unpacked_rows():
    torch_rule = linear_attention._torch_rule(_original(linear_attention.RULE))

    def refusing(*args, **kwargs):
        raise RuntimeError("this Triton produces incorrect results on this GPU\nmore")

    def per_sequence(*args, cu_seqlens=None, **kwargs):
        return linear_attention.packed_rule(torch_rule, native=False)(*args, cu_seqlens=cu_seqlens, **kwargs)

    def wrong(*args, cu_seqlens=None, **kwargs):
        out, state = torch_rule(*args, **kwargs)  # over the whole row: sequences see each other
        return out, state

    cpu = torch.device("cpu")
    refused = linear_attention.probe_native(_kernel_behind(torch_rule, refusing), cpu)
    assert refused == (
        "flash-linear-attention's delta rule fails here (this Triton produces incorrect results on this GPU)"
    )
    assert "differs from transformers' torch rule" in linear_attention.probe_native(
        _kernel_behind(torch_rule, wrong), cpu
    )
    assert linear_attention.probe_native(_kernel_behind(torch_rule, per_sequence), cpu) is None

    kernel = _kernel_behind(torch_rule, refusing)
    assert linear_attention.reads_offsets(kernel)
    rule = linear_attention.packed_rule(kernel, native=False, refused=refused)
    assert "one sequence at a time (flash-linear-attention's delta rule fails here" in rule.hone_says
    inputs = _delta_rule_inputs(2)
    torch.testing.assert_close(rule(**inputs)[0], torch_rule(**inputs)[0])  # unpacked: the torch rule, not the kernel
    packed = rule(**inputs, cu_seqlens=_offsets(LENGTHS, registered=True))[0]
    torch.testing.assert_close(packed, per_sequence(**inputs, cu_seqlens=_offsets(LENGTHS, registered=True))[0])

"""Packed attention through transformers' AttentionInterface on the CPU (SDPA per packed row, which `auto` takes
there, and SDPA with one block mask): same loss and gradients as each sequence run alone, no leakage between
sequences, metadata read once per batch, no mask or packed detection in transformers, backend choice and revert."""

from __future__ import annotations

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.speed.attention import backends
from hone.core.speed.attention import choice as attention
from hone.core.train.loss import loss_sum
from tests.helpers.packed import assert_grads_close, grads, model_of, per_sequence_loss, random_rows

SHAPES = ["tiny-llama", "tiny-dense", "tiny-mistral-swa"]


def test_block_causal_mask_by_hand():
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(backends.block_causal_mask(cu, 5)[0, 0], want)
    windowed = want & ~torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0] * 5, [0] * 5]).bool()
    assert torch.equal(backends.block_causal_mask(cu, 5, sliding_window=2)[0, 0], windowed)


def test_metadata_from_position_ids_matches_the_collator():
    batch = collate_packed(random_rows([4, 9, 1, 6]))
    cu, longest = backends.metadata_from_position_ids(batch.position_ids)
    assert cu.dtype == torch.int32 and cu.tolist() == batch.cu_seqlens.tolist() and longest == batch.max_seqlen


# speed.attention -> (backend, implementation, metadata built once per batch: (stats field, count))
BACKENDS = {"auto": ("rows", "hone_rows", ("length_reads", 1)), "sdpa": ("sdpa", "hone_blockmask", ("mask_builds", 1))}


@pytest.mark.parametrize("requested", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_packed_loss_and_grads_equal_sequences_run_one_by_one(shape, requested):
    model = model_of(shape)
    rows = random_rows([13, 5, 21, 9], seed=7)  # the sliding-window shape's window (8) is shorter than three rows
    want = per_sequence_loss(model, rows)  # transformers' own SDPA, one sequence at a time
    want.backward()
    want_grads = grads(model)
    model.zero_grad()

    choice = attention.configure(model, SpeedConfig(attention=requested), "cpu")
    name, implementation, (built, times) = BACKENDS[requested]
    assert choice.name == name and choice.implementation == implementation
    stats = backends.reset_stats()
    got = loss_sum(model, collate_packed(rows))
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    assert_grads_close(grads(model), want_grads)
    assert stats.packed_calls == model.config.num_hidden_layers and stats.fallback_calls == 0
    assert getattr(stats, built) == times, "the batch's mask or row lengths built once, shared by every layer"


@pytest.mark.parametrize("requested", BACKENDS)
@pytest.mark.parametrize("per_layer", [False, True])
def test_no_leakage_between_packed_sequences(per_layer, requested):
    """Changing sequence B (before and after A) leaves A's logits unchanged; B's own logits do change."""
    model = model_of("tiny-mistral-swa")
    attention.configure(model, SpeedConfig(attention=requested), "cpu", per_layer_metadata=per_layer)
    a, b, b2 = random_rows([12], seed=1)[0], random_rows([10], seed=2)[0], random_rows([10], seed=3)[0]

    def logits(rows):
        with torch.no_grad():
            return model(**collate_packed(rows).model_inputs()).logits[0]

    first, changed = logits([b, a, b]), logits([b2, a, b2])
    torch.testing.assert_close(changed[10:22], first[10:22], rtol=0, atol=1e-6)
    assert (changed[:10] - first[:10]).abs().max() > 1e-3
    alone = logits([a])
    torch.testing.assert_close(first[10:22], alone, rtol=1e-5, atol=1e-5)


def test_metadata_built_once_per_batch_and_transformers_builds_no_mask(monkeypatch):
    from transformers import masking_utils

    calls = []
    real = masking_utils.find_packed_sequence_indices
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = model_of("tiny-dense")
    batch = collate_packed(random_rows([6, 9, 4], seed=4))
    layers = model.config.num_hidden_layers

    model(**batch.model_inputs())  # transformers' SDPA: detects packing from position_ids (a sync on a GPU)
    assert len(calls) == 1

    calls.clear()
    attention.configure(model, SpeedConfig(attention="sdpa"), "cpu")
    model.gradient_checkpointing_enable()
    model.train()
    stats = backends.reset_stats()
    loss_sum(model, batch).backward()  # the checkpointed layers run their forward twice
    assert calls == [], "transformers must not inspect position_ids for packing"
    assert stats.mask_builds == 1 and stats.metadata_builds == 0
    assert stats.packed_calls == 2 * layers

    attention.configure(model, SpeedConfig(attention="sdpa"), "cpu", per_layer_metadata=True)
    stats = backends.reset_stats()
    loss_sum(model, batch).backward()
    assert stats.mask_builds == 2 * layers, "the benchmark variant rebuilds the mask in every layer call"

    attention.configure(model, SpeedConfig(), "cpu")  # per packed row: lengths read once, then every layer
    stats = backends.reset_stats()
    loss_sum(model, batch).backward()
    assert calls == [] and stats.length_reads == 1 and stats.mask_builds == 0 and stats.packed_calls == 2 * layers


def test_configure_reports_and_reverts():
    model = model_of("tiny-llama")
    batch = collate_packed(random_rows([7, 5], seed=5))
    with torch.no_grad():
        before = model(**batch.model_inputs()).logits

    choice = attention.configure(model, SpeedConfig(attention="varlen"), "cpu")
    assert choice.name == "sdpa" and "CUDA" in choice.reason and choice.previous == "sdpa"
    assert model.config._attn_implementation == "hone_blockmask"
    with torch.no_grad():
        torch.testing.assert_close(model(**batch.model_inputs()).logits, before, rtol=1e-5, atol=1e-5)
    attention.revert(model, choice)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        torch.testing.assert_close(model(**batch.model_inputs()).logits, before, rtol=1e-5, atol=1e-5)

    hf = attention.configure(model, SpeedConfig(attention="hf"), "cpu")
    assert hf.name == "hf" and model.config._attn_implementation == "sdpa"
    off = attention.configure(model, SpeedConfig(packing=False), "cpu")
    assert off.name == "hf" and "packing is off" in off.reason


def test_unsupported_models_keep_transformers_attention():
    model = model_of("tiny-dense")
    model.config.attention_dropout = 0.1
    choice = attention.configure(model, SpeedConfig(), "cpu")
    assert choice.name == "hf" and "attention dropout" in choice.reason
    assert model.config._attn_implementation == choice.previous


def test_packed_gptoss_with_sinks_equals_its_sequences_run_one_by_one_on_the_cpu():
    """gpt-oss's own masks ignore the position ids (a packed row attends across its sequences); Hone's shared
    block mask with the sink attention computed densely gives each sequence's own loss and gradients."""
    model = model_of("tiny-moe-gptoss")
    rows = random_rows([13, 5, 21, 9], seed=7)  # 13 and 21 are past the tiny shape's 8-token window
    want = per_sequence_loss(model, rows)  # transformers' eager attention with sinks, one sequence at a time
    want.backward()
    want_grads = grads(model)
    model.zero_grad()

    choice = attention.configure(model, SpeedConfig(attention="auto"), "cpu")
    assert choice.name == "sdpa" and "sinks" in choice.reason
    stats = backends.reset_stats()
    got = loss_sum(model, collate_packed(rows))
    got.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-4)
    assert_grads_close(grads(model), want_grads)
    assert any("sinks" in name for name in want_grads)
    assert stats.packed_calls == model.config.num_hidden_layers and stats.fallback_calls == 0

    # an unpacked call (generation, no packed metadata) keeps the sinks too: the eager logits of one sequence
    ids = torch.as_tensor(rows[2].input_ids)[None]
    with torch.no_grad():
        got_logits = model(input_ids=ids, use_cache=False).logits
        attention.revert(model, choice)
        want_logits = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)


def test_configure_through_peft_and_unpacked_calls_fall_back():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model_of("tiny-mistral-swa"), LoraConfig(r=4, target_modules="all-linear"))
    rows = random_rows([20, 11], seed=6)
    want = per_sequence_loss(model, rows)
    attention.configure(model, SpeedConfig(), "cpu")
    assert model.get_base_model().config._attn_implementation == "hone_rows"
    torch.testing.assert_close(loss_sum(model, collate_packed(rows)), want, rtol=1e-5, atol=1e-4)
    stats = backends.reset_stats()
    # a plain single row longer than the 8-token window, without packed metadata: transformers' SDPA with the
    # window mask, so it still equals the reference
    torch.testing.assert_close(per_sequence_loss(model, rows), want, rtol=1e-5, atol=1e-5)
    assert stats.fallback_calls > 0 and stats.packed_calls == 0


def test_attention_bench_runs_on_cpu_and_agrees_with_the_dense_path():
    from hone.core.bench.attention import format_table, packed_lengths, run

    lengths = packed_lengths(700, seed=3, low=16, high=200)
    assert sum(lengths) == 700 and min(lengths) > 0
    result = run(heads=4, kv_heads=2, head_dim=16, window=24, seq_lens=lengths, repeats=1, warmup=0, layers=4)
    assert result["backend"] == "sdpa" and result["tokens"] == 700 and result["sequences"] == len(lengths)
    assert result["max_abs_diff"] < 1e-5, "packed attention must equal transformers' dense-mask attention"
    assert result["mask_builds_per_layer_ours"] == 0.25, "one shared mask over 4 layers"
    assert result["mask_builds_per_layer_ours_per_layer"] == 1.0
    assert all(result[key] > 0 for key in ("dense_total_ms", "ours_ms", "ours_per_layer_ms", "dense_mask_build_ms"))
    assert "speedup" in format_table(result)


class _FlashLike(torch.autograd.Function):
    """Dense attention with flash's backward contract (what `SinkRescale` relies on): (T, H, D) layout, returns
    (out, lse (H, T)), saves its output and recomputes the probabilities from lse; an lse gradient is ignored and
    d scores = p * (dO . v - rowsum(dO * saved out))."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        scores = torch.einsum("thd,shd->hts", q, k) * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # (H, T)
        out = torch.einsum("hts,shd->thd", torch.exp(scores - lse[..., None]), v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask = mask
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        scores = (torch.einsum("thd,shd->hts", q, k) * scale).masked_fill(~ctx.mask, float("-inf"))
        p = torch.exp(scores - lse[..., None])
        dv = torch.einsum("hts,thd->shd", p, d_out)
        dp = torch.einsum("thd,shd->hts", d_out, v)
        ds = p * (dp - (d_out * out).sum(-1).T[..., None])
        return torch.einsum("hts,shd->thd", ds, k) * scale, torch.einsum("hts,thd->shd", ds, q) * scale, dv, None


def test_sink_rescale_after_a_flash_style_node_gives_the_gradients_of_sink_attention():
    from hone.core.speed.attention import sink_attention_reference

    gen = torch.Generator().manual_seed(3)
    lengths, heads, dim = [5, 9, 2], 3, 8
    total = sum(lengths)
    cu = torch.tensor([0, 5, 14, 16], dtype=torch.int32)
    mask = backends.block_causal_mask(cu, total, None)
    leaves = [torch.randn(total, heads, dim, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3)]
    sinks = torch.randn(heads, generator=gen, dtype=torch.float64).requires_grad_()
    grad_out = torch.randn(total, heads, dim, generator=gen, dtype=torch.float64)

    out, lse = _FlashLike.apply(*leaves, mask[0, 0])
    got = backends.SinkRescale.apply(out, backends._rows_by_heads(lse, total, heads), sinks)
    (got * grad_out).sum().backward()
    got_grads = [t.grad for t in (*leaves, sinks)]

    ref_leaves = [t.detach().clone().requires_grad_() for t in (*leaves, sinks)]
    q, k, v = (t.transpose(0, 1)[None] for t in ref_leaves[:3])
    want = sink_attention_reference(q, k, v, mask, ref_leaves[3])
    (want * grad_out).sum().backward()
    torch.testing.assert_close(got, want)
    for name, g, t in zip(("dq", "dk", "dv", "d sinks"), got_grads, ref_leaves, strict=True):
        torch.testing.assert_close(g, t.grad, msg=lambda m, n=name: f"{n}: {m}")
    # without the saved output kept in step, the gradients of q and k miss lse's share
    assert not torch.allclose(leaves[0].grad, torch.zeros_like(leaves[0].grad))


def test_sink_models_on_a_gpu_take_varlen_through_its_sink_probe_else_the_block_mask(monkeypatch):
    model = model_of("tiny-moe-gptoss")
    seen = {}

    def probe(device, dtype, heads, kv_heads, head_dim, windows, sinks=False, value_dim=None):
        seen["sinks"] = sinks
        return "probe says no"

    monkeypatch.setattr(attention, "probe_varlen", probe)
    monkeypatch.setattr(attention.backends, "varlen_available", lambda: True)
    monkeypatch.setattr(attention, "_model_dtype", lambda model: torch.bfloat16)
    name, reason, _ = attention.choose(model, "auto", "cuda")
    assert seen == {"sinks": True} and name == "sdpa" and "probe says no" in reason and "sinks" in reason
    assert attention.choose(model, "flash", "cuda")[0] == "sdpa"  # flash-attn has no sinks
    assert "attend to each other" in attention.choose(model, "hf", "cuda")[1]
    probed = attention.backends.VarlenOptions(window=True, gqa_flag=False, lse=True)
    monkeypatch.setattr(attention, "probe_varlen", lambda *args, **kwargs: probed)
    name, reason, options = attention.choose(model, "auto", "cuda")
    assert name == "varlen" and "sink" in reason and options is probed


def _cpu_varlen(seen: list):
    """Stand-in for the CUDA varlen kernel on the CPU: packed causal SDPA, recording the options of each call."""

    def attend(query, key, value, cu, max_len, scaling, window, sinks=None, options=None, module=None):
        seen.append(options)
        total = query.shape[2]
        groups = query.shape[1] // key.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            key.repeat_interleave(groups, 1),
            value.repeat_interleave(groups, 1),
            attn_mask=backends.block_causal_mask(cu, total, window),
            scale=scaling,
        )
        return out.transpose(1, 2).reshape(total, query.shape[1], query.shape[3])

    return attend


def test_two_models_in_one_process_keep_their_own_varlen_options(monkeypatch):
    """The base model and a fine-tune (the Chat page holds both) are configured with different varlen options; each
    model's layers call the kernel with its own, whichever was configured last."""
    seen = []
    monkeypatch.setattr(backends, "_varlen", _cpu_varlen(seen))
    monkeypatch.setattr(backends, "varlen_available", lambda: True)
    monkeypatch.setattr(attention, "_model_dtype", lambda model: torch.bfloat16)
    probed = {}

    def probe(device, dtype, heads, kv_heads, head_dim, windows, sinks=False, value_dim=None):
        return probed["next"]

    monkeypatch.setattr(attention, "probe_varlen", probe)
    first, second = model_of("tiny-llama"), model_of("tiny-llama")
    probed["next"] = backends.VarlenOptions(window=True, gqa_flag=False, repeat_kv=True)
    choice_first = attention.configure(first, SpeedConfig(attention="varlen", grouped_attention_backward=True), "cuda")
    probed["next"] = backends.VarlenOptions(window=True, gqa_flag=True)
    choice_second = attention.configure(second, SpeedConfig(attention="varlen"), "cuda")
    assert choice_first.varlen == backends.VarlenOptions(
        window=True, gqa_flag=False, repeat_kv=True, grouped_backward=True
    )
    assert choice_second.varlen == backends.VarlenOptions(window=True, gqa_flag=True)
    assert choice_first.implementation != choice_second.implementation
    assert "group of whole sequences" in choice_first.reason and "group" not in choice_second.reason

    batch = collate_packed(random_rows([5, 9, 3], vocab=first.config.vocab_size))
    layers = first.config.num_hidden_layers
    for model, want in ((first, choice_first.varlen), (second, choice_second.varlen), (first, choice_first.varlen)):
        seen.clear()
        with torch.no_grad():
            loss_sum(model, batch)
        assert seen == [want] * layers
    attention.revert(first, choice_first)
    assert first.config._attn_implementation == choice_first.previous
    assert second.config._attn_implementation == choice_second.implementation

"""GPU tests for packed attention (run with `pytest -m gpu tests/core/speed/attention/test_attention_gpu.py -s`).

- varlen (and flash-attn, when installed) attention equals each sequence attended alone, with gradients;
- a packed model's loss and gradients through varlen equal the sequences run one by one;
- a packed LoRA training step's forward + backward makes no host sync (`set_sync_debug_mode("error")`), while
  transformers' own SDPA path and the per-layer-metadata variant do (showing the check can fail);
- the attention-alone benchmark on a 16K packed batch runs, agrees with the dense path and builds no mask.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.speed import attention
from hone.core.speed.attention import backends
from hone.core.train.loss import loss_sum
from tests.helpers.packed import grads, model_of, per_sequence_loss, random_rows

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda"


def per_sequence_attention(q, k, v, lengths, window):
    """Reference: each sequence alone, fp32, SDPA with an explicit causal (and window) mask."""
    outs, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (t[:, :, start : start + n].float() for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
        i = torch.arange(n, device=q.device)
        mask = i[:, None] >= i[None, :]
        if window is not None:
            mask &= (i[:, None] - i[None, :]) < window
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask))
        start += n
    return torch.cat(outs, dim=2).transpose(1, 2)  # (1, T, H, D)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))


class _Layer(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _check_backend(fn, heads, kv_heads, head_dim, window, lengths=(1, 17, 300, 64, 129)):
    batch = collate_packed(random_rows(lengths, vocab=100)).to(DEVICE)
    total = batch.num_tokens
    g = torch.Generator().manual_seed(heads * 31 + head_dim)
    q, k, v = (
        torch.randn(1, h, total, head_dim, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    )
    grad_out = torch.randn(1, total, heads, head_dim, generator=g).to(DEVICE, torch.bfloat16)
    layer = _Layer(heads // kv_heads).to(DEVICE).train()
    out, _ = fn(
        layer,
        q,
        k,
        v,
        None,
        scaling=head_dim**-0.5,
        sliding_window=window,
        **{key: val for key, val in batch.model_inputs().items() if key not in ("input_ids", "use_cache")},
    )
    out.backward(grad_out)
    got = [out.detach(), q.grad, k.grad, v.grad]

    q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = per_sequence_attention(q2, k2, v2, list(lengths), window)
    ref.backward(grad_out.float())
    want = [ref.detach(), q2.grad, k2.grad, v2.grad]
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
        err = relative_error(a, b)
        label = getattr(fn, "__name__", None) or fn.func.__name__
        assert err < 2e-2, f"{label} {heads}/{kv_heads}x{head_dim} window={window}: {name} relative error {err:.3g}"


GEOMETRIES = [(16, 8, 128), (4, 4, 64), (8, 1, 64), (16, 8, 256)]


@needs_cuda
@pytest.mark.parametrize("window", [None, 7, 100])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES)
def test_varlen_attention_equals_per_sequence(heads, kv_heads, head_dim, window):
    if not backends.varlen_available():
        pytest.fail(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    options = attention.probe_varlen(torch.device(DEVICE), torch.bfloat16, heads, kv_heads, head_dim, [None, window])
    assert isinstance(options, backends.VarlenOptions), options
    print(f"varlen options: {options}")
    _check_backend(functools.partial(backends.varlen_attention, options=options), heads, kv_heads, head_dim, window)


@needs_cuda
@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES[:3])
def test_varlen_backward_in_sequence_groups_equals_per_sequence(heads, kv_heads, head_dim, grouped, monkeypatch):
    """`hone.core.speed.attention.grouped_backward` with the flash kernel: groups of <= 2,048 tokens ([1500] [700]
    [1800, 40] [900] [2100]), and the same batch back-propagated whole."""
    from hone.core.speed.attention import grouped_backward

    options = attention.probe_varlen(torch.device(DEVICE), torch.bfloat16, heads, kv_heads, head_dim, [None])
    assert isinstance(options, backends.VarlenOptions), options
    monkeypatch.setattr(grouped_backward, "WORKSPACE_BYTES", 2048 * heads * head_dim * 8)
    calls = []
    original = grouped_backward.GroupedBackwardAttention.backward
    monkeypatch.setattr(
        grouped_backward.GroupedBackwardAttention,
        "backward",
        staticmethod(lambda ctx, g: calls.append(len(ctx.groups)) or original(ctx, g)),
    )
    _check_backend(
        functools.partial(backends.varlen_attention, options=replace(options, grouped_backward=grouped)),
        heads,
        kv_heads,
        head_dim,
        None,
        lengths=(1500, 700, 1800, 40, 900, 2100),
    )
    assert calls == ([5] if grouped else []), calls


@needs_cuda
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES[:3])
def test_flash_attn_package_equals_per_sequence(heads, kv_heads, head_dim, window):
    pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    _check_backend(backends.fa2_attention, heads, kv_heads, head_dim, window)


@needs_cuda
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(64, 8, 64), (4, 4, 128)])
def test_varlen_with_sinks_passes_its_probe_at_gptoss_shapes(heads, kv_heads, head_dim):
    """Outputs and the gradients of q, k, v and the sinks against the dense fp32 reference (gpt-oss-20b's heads,
    its 128-token window and full attention)."""
    options = attention.probe_varlen(
        torch.device(DEVICE), torch.bfloat16, heads, kv_heads, head_dim, [None, 128], sinks=True
    )
    assert isinstance(options, backends.VarlenOptions), options


@needs_cuda
@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-dense", "tiny-mistral-swa", "tiny-moe-gptoss"])
def test_varlen_packed_model_equals_sequences_run_one_by_one(shape):
    model = model_of(shape).to(DEVICE, torch.bfloat16)
    rows = random_rows([130, 7, 300, 41], seed=11)
    want = per_sequence_loss(model, rows)  # transformers' SDPA, one sequence at a time, bf16
    want.backward()
    want_grads = grads(model)
    model.zero_grad()

    choice = attention.configure(model, SpeedConfig(attention="varlen"), DEVICE)
    assert choice.name == "varlen", f"varlen was not chosen: {choice.reason}"
    stats = backends.reset_stats()
    got = loss_sum(model, collate_packed(rows).to(DEVICE))
    got.backward()
    assert stats.packed_calls == model.config.num_hidden_layers and stats.mask_builds == 0
    assert math.isclose(got.item(), want.item(), rel_tol=1e-2), f"{shape}: packed {got.item()} vs {want.item()}"
    got_grads = grads(model)
    assert got_grads.keys() == want_grads.keys()
    # bf16 on both sides, different kernels: the whole gradient agrees to a few percent, each tensor to 10%
    overall = relative_error(
        torch.cat([g.flatten() for g in got_grads.values()]), torch.cat([want_grads[n].flatten() for n in got_grads])
    )
    assert overall < 3e-2, f"{shape}: gradients relative error {overall:.3g}"
    for name, g in got_grads.items():
        err = relative_error(g, want_grads[name])
        assert err < 1e-1, f"{shape}: gradient of {name} relative error {err:.3g}"
    attention.revert(model, choice)
    assert model.config._attn_implementation == choice.previous


def _lora_model(checkpointing: bool):
    from peft import LoraConfig, get_peft_model

    model = model_of("tiny-dense").to(DEVICE, torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    model.train()
    return model


def _step(model, cpu_batch):
    batch = cpu_batch.to(DEVICE)
    loss = loss_sum(model, batch)
    (loss / batch.num_trained).backward()
    return loss


def step_without_sync(model, cpu_batch):
    """One warm-up step (lazy CUDA/cuBLAS initialisation may sync once), then a step under
    `set_sync_debug_mode("error")`: any host sync inside its forward + backward raises. Returns that step's loss."""
    _step(model, cpu_batch)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return _step(model, cpu_batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_training_step_makes_no_host_sync(checkpointing):
    model = _lora_model(checkpointing)
    choice = attention.configure(model, SpeedConfig(), DEVICE)
    assert choice.name in ("varlen", "flash"), f"expected a varlen kernel on CUDA: {choice.reason}"
    loss = step_without_sync(model, collate_packed(random_rows([200, 37, 511, 90, 3], seed=12), pin_memory=True))
    value = loss.item()  # the deferred read-out, after the step
    assert math.isfinite(value) and value > 0
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


@needs_cuda
@pytest.mark.parametrize("variant", ["transformers-sdpa", "per-layer-metadata"])
def test_sync_check_catches_paths_that_sync(variant):
    """The same step through transformers' SDPA (packed detection calls .all()) or the per-layer-metadata
    variant (nonzero / .item() per layer) does sync: the check above is able to fail."""
    model = _lora_model(False)
    if variant == "per-layer-metadata":
        attention.configure(model, SpeedConfig(), DEVICE, per_layer_metadata=True)
    cpu_batch = collate_packed(random_rows([64, 100], seed=13), pin_memory=True)
    _step(model, cpu_batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match=r"(?i)synchroniz"):
            _step(model, cpu_batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
def test_attention_bench_16k():
    from hone.core.bench.attention import format_table, run

    result = run(tokens=16384)
    print("\n" + format_table(result))
    assert result["backend"] in ("varlen", "flash"), result["backend_description"]
    assert result["max_abs_diff"] < 5e-2, f"varlen vs dense-mask output differ by {result['max_abs_diff']}"
    assert result["mask_builds_per_layer_ours"] == 0
    assert result["mask_builds_per_layer_ours_per_layer"] == 1
    assert result["speedup"] > 1.0, f"packed attention slower than the dense mask path: {result}"


@needs_cuda
def test_step_bench_runs_all_variants():
    from hone.core.bench.attention_step import format_step_table, run_step

    results = run_step("dense-0.6b", tokens=4096, layers=2, steps=2, warmup=1)
    print("\n" + format_step_table(results))
    assert [r["variant"] for r in results] == ["reference", "ours", "ours_per_layer"]
    assert results[1]["attention"] in ("varlen", "flash"), results[1]["attention_reason"]
    for r in results:
        assert math.isfinite(r["last_loss"]) and r["tokens_per_s"] > 0, r
    assert math.isclose(results[0]["last_loss"], results[1]["last_loss"], rel_tol=5e-2), results

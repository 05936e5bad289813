"""GPU tests for long rows through cuDNN (run with `pytest -m gpu tests/core/speed/attention/test_long_rows_gpu.py -s`).

- the probe passes at real attention shapes and says how cuDNN is called;
- a packed batch with long and short sequences equals each sequence attended alone, output and gradients;
- `auto` takes the path on Hopper and says so; a LoRA step with long rows makes no host sync;
- the crossover table (`python -m hone.core.bench.long_rows`) runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch

from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.speed import attention
from hone.core.speed.attention import backends, long_rows
from tests.core.speed.attention.test_attention_gpu import _check_backend, _lora_model, _step, step_without_sync
from tests.helpers.packed import model_of, random_rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICE = "cuda"


def _probed(heads, kv_heads, head_dim, threshold):
    varlen = attention.probe_varlen(torch.device(DEVICE), torch.bfloat16, heads, kv_heads, head_dim, [None])
    assert isinstance(varlen, backends.VarlenOptions), varlen
    long = attention.probe_long_rows(torch.device(DEVICE), torch.bfloat16, heads, kv_heads, head_dim, varlen, threshold)
    assert isinstance(long, long_rows.LongRows), long
    print(f"{heads}/{kv_heads}x{head_dim}: {long.tag()}")
    return replace(varlen, long_rows=long)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(32, 8, 128), (16, 8, 128), (8, 1, 64), (4, 4, 64)])
def test_long_and_short_sequences_equal_each_alone(heads, kv_heads, head_dim):
    options = _probed(heads, kv_heads, head_dim, threshold=1024)
    _check_backend(
        functools.partial(backends.varlen_attention, options=options),
        heads,
        kv_heads,
        head_dim,
        None,
        lengths=(1500, 17, 300, 1024, 64, 1100),
    )


def test_auto_takes_cudnn_for_long_rows_on_hopper_and_says_so():
    model = model_of("tiny-dense").to(DEVICE, torch.bfloat16)
    choice = attention.configure(model, SpeedConfig(), DEVICE)
    hopper = torch.cuda.get_device_capability()[0] == 9
    assert choice.name == "varlen", choice.reason
    assert (choice.varlen.long_rows is not None) == hopper, choice.reason
    assert ("through cuDNN attention" in choice.reason) == hopper, choice.reason
    off = attention.configure(
        model_of("tiny-dense").to(DEVICE, torch.bfloat16), SpeedConfig(long_row_attention="off"), DEVICE
    )
    assert off.varlen.long_rows is None and "long_row_attention = off" in off.reason


def test_a_step_with_long_rows_makes_no_host_sync(monkeypatch):
    monkeypatch.setattr(long_rows, "LONG_ROW_TOKENS", 256)
    from hone.core.speed.checkpointing.checkpointer import apply_checkpointing

    model = _lora_model(False)
    apply_checkpointing(model, "gpu", DEVICE)  # its layers keep their long-row attention for the backward
    choice = attention.configure(model, SpeedConfig(long_row_attention="on"), DEVICE)
    assert choice.varlen is not None and choice.varlen.long_rows is not None, choice.reason
    calls = []
    original = long_rows._SpanAttention.forward
    monkeypatch.setattr(
        long_rows._SpanAttention, "forward", staticmethod(lambda ctx, *a: calls.append(len(a[3])) or original(ctx, *a))
    )
    loss = step_without_sync(model, collate_packed(random_rows([600, 37, 511, 90, 3], seed=12), pin_memory=True))
    assert math.isfinite(loss.item())
    assert calls and set(calls) == {4}  # [600] [37] [511] [90, 3]


def test_crossover_table_runs():
    from hone.core.bench.long_rows import crossover, format_table

    result = crossover(tokens=8192, lengths=(1024, 4096), repeats=2, warmup=1)
    print("\n" + format_table(result))
    assert [row["length"] for row in result["rows"]] == [1024, 4096]
    assert all(row["varlen_ms"] > 0 and row["cudnn_ms"] > 0 for row in result["rows"])


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def test_checkpointed_layers_keep_long_row_attention_and_train_the_same(monkeypatch):
    """With Hone's checkpointer: keeping the attention from the forward runs cuDNN once per layer and span instead
    of twice, and gives the loss and LoRA gradients of the run that attends again in the recompute, within the
    noise of that run against itself (cuDNN's bf16 backward is not bit-reproducible)."""
    from hone.core.speed.checkpointing.checkpointer import apply_checkpointing

    monkeypatch.setattr(long_rows, "LONG_ROW_TOKENS", 256)
    calls = []
    original = long_rows.dense_causal
    monkeypatch.setattr(long_rows, "dense_causal", lambda *a: calls.append(1) or original(*a))
    cpu_batch = collate_packed(random_rows([600, 37, 511, 90, 3], seed=14), pin_memory=True)
    results = []
    for keep in (False, False, True):
        torch.manual_seed(0)
        model = _lora_model(False)
        apply_checkpointing(model, "gpu", DEVICE)
        choice = attention.configure(model, SpeedConfig(long_row_attention="on", keep_long_row_attention=keep), DEVICE)
        assert choice.varlen.long_rows.keep == keep, choice.reason
        calls.clear()
        loss = _step(model, cpu_batch)
        layers = model.get_base_model().config.num_hidden_layers
        assert len(calls) == 2 * layers * (1 if keep else 2), (keep, len(calls))
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.item(), grads))
    (loss, grads), (_, grads_again), (kept_loss, kept) = results
    assert kept_loss == pytest.approx(loss, rel=1e-6)
    assert kept.keys() == grads.keys()
    noise = max(_relative(grads_again[name], grad) for name, grad in grads.items())
    tolerance = max(5e-3, 5 * noise)
    errors = {name: _relative(kept[name], grad) for name, grad in grads.items()}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tolerance, f"{worst}: relative error {errors[worst]:.2e} (noise {noise:.2e})"


def test_a_batch_of_one_long_row_returns_cudnns_own_output():
    """cuDNN lays its output out token-major: a batch that is one long row returns that output itself, the one the
    kernel keeps for backward, instead of a copy beside it."""
    options = _probed(32, 8, 128, threshold=1024)
    how = options.long_rows
    tokens = 8192
    cu = torch.tensor([0, tokens], dtype=torch.int32, device=DEVICE)
    from hone.core.data.batch_lengths import register_batch

    register_batch(cu, [tokens])
    spans = long_rows.spans(cu, how.threshold)
    q, k, v = (torch.randn(tokens, h, 128, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for h in (32, 8, 8))
    out = long_rows.attention(q, k, v, cu, spans, None, None, how)
    piece = out.grad_fn.graphs[0][1]
    assert out.data_ptr() == piece.data_ptr() and out.shape == q.shape and out.is_contiguous()
    with torch.no_grad():
        plain = long_rows.attention(q, k, v, cu, spans, None, None, how)
    torch.testing.assert_close(plain, out.detach())
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.isfinite().all() for t in (q, k, v))

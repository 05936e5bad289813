"""GPU checks of the benchmark's measurements (run with `pytest -m gpu` on the CUDA machine)."""

from __future__ import annotations

import pytest
import torch

from hone.core.bench.measure import GIB, Settings, StepOutcome, count_syncs, matmul_rate, measure_run
from hone.core.bench.report import ratio_table
from hone.core.bench.run import BenchOptions, run_bench

pytestmark = pytest.mark.gpu


class _SyncInBackward(torch.autograd.Function):
    """Identity whose backward reads a value on the host: one sync inside the backward pass."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad.sum().item()
        return grad


def test_sync_counting_sees_item_and_syncs_inside_backward():
    x = torch.randn(4096, device="cuda", requires_grad=True)
    quiet = count_syncs(lambda: (x * 2).sum(), "cuda")
    assert quiet == 0, f"an elementwise op and a sum counted {quiet} syncs"
    item = count_syncs(lambda: x.sum().item(), "cuda")
    assert item == 1, f".item() counted {item} syncs, expected 1"
    backward = count_syncs(lambda: _SyncInBackward.apply(x).sum().backward(), "cuda")
    assert backward >= 1, "a .item() inside backward (autograd's device thread) was not counted"


def test_matmul_rate_is_a_gpu_rate():
    rate = matmul_rate("cuda", torch.bfloat16)
    assert 5e13 < rate < 5e15, f"bf16 matmul at {rate / 1e12:.1f} TFLOP/s is outside any current GPU's range"


class _AllocatingRunner:
    """Holds 4 GiB like a model, then asks the allocator for 1 TiB: a real CUDA out-of-memory error."""

    kind = "hone"

    def __init__(self, name, fail: bool):
        self.name, self.fail, self.weights = name, fail, None

    def setup(self):
        self.weights = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")

    def step(self):
        if self.fail:
            torch.empty(2**40, dtype=torch.uint8, device="cuda")
        return StepOutcome(loss=1.0, grad_norm=1.0)

    def forward_backward(self):
        pass

    def teardown(self):
        self.weights = None

    def describe(self):
        return {"speed_paths": {}, "trainable_params": 1, "active_params": 1}


def test_a_real_cuda_oom_is_recorded_and_the_next_run_starts_on_an_empty_gpu():
    settings = Settings(warmup=1, steps=1, device="cuda", tokens=1, peak_flops=None)
    before = torch.cuda.memory_allocated() / GIB
    failed = measure_run(_AllocatingRunner("big", fail=True), settings)
    assert failed.status == "oom", f"{failed.status}: {failed.reason}"
    assert failed.peak_allocated_gib >= 4.0, f"peak at the OOM {failed.peak_allocated_gib} GiB, expected >= 4"
    after = measure_run(_AllocatingRunner("next", fail=False), settings)
    assert after.status == "ok"
    assert after.memory_before_gib < before + 0.1, (
        f"the next run started with {after.memory_before_gib:.2f} GiB allocated (before: {before:.2f})"
    )


def test_a_small_real_shape_benchmark_measures_every_number():
    """llama-1b with 2 layers on 4,096 tokens: reference, Hone with every path off and with all on."""
    options = BenchOptions(
        scenario="llama-1b", layers=2, tokens=4096, steps=2, warmup=1, only=["hone-base", "all"], micro="on"
    )
    report = run_bench(options)
    from rich.console import Console

    Console(width=160).print(ratio_table(report.runs, "reference", "llama-1b, 2 layers, 4,096 tokens"))
    runs = {r.name: r for r in report.runs}
    assert set(runs) == {"reference", "hone-base", "all"}
    for name, run in runs.items():
        assert run.ok, f"{name}: {run.status}: {run.reason}\n{run.details}"
        assert run.peak_allocated_gib > 0 and run.peak_reserved_gib >= run.peak_allocated_gib
        assert 0 < run.mfu < 1, f"{name}: MFU {run.mfu}"
        assert isinstance(run.syncs_fwd_bwd, int), f"{name}: syncs not counted"
        assert run.parity, (
            f"{name}: first-step loss {run.first_loss} vs reference {runs['reference'].first_loss}, "
            f"grad-norm difference {run.grad_norm_rel_diff}"
        )
    assert report.matmul_tflops > 50
    assert report.environment["gpu"] and report.environment["packages"]["torch"]
    micro = report.attention_micro
    assert micro["status"] == "ok", f"attention micro-benchmark: {micro}"
    assert micro["result"]["tokens"] == 4096


def test_a_memory_cap_binds_every_run_and_is_lifted_afterwards():
    """llama-1b with 2 layers under a 2 GiB cap: the reference (HF checkpointing, untiled loss over 8,192 tokens)
    cannot fit, Hone's `all` can; the process's own limit is back to the whole GPU afterwards."""
    options = BenchOptions(
        scenario="llama-1b",
        layers=2,
        tokens=8192,
        steps=1,
        warmup=1,
        only=["all"],
        micro="off",
        count_syncs=False,
        memory_cap=2.0 * GIB,
    )
    runs = {r.name: r for r in run_bench(options).runs}
    assert runs["reference"].status == "oom", f"{runs['reference'].status}: peak {runs['reference'].peak_reserved_gib}"
    assert runs["all"].ok, f"{runs['all'].status}: {runs['all'].reason}"
    assert runs["all"].peak_reserved_gib <= 2.0
    assert torch.cuda.get_per_process_memory_fraction() == 1.0

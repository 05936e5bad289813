"""measure_run: timing and loss bookkeeping, and what happens when a run runs out of memory, fails or cannot
run here. The runner is a double with the real Runner shape; the bookkeeping is the real code path."""

from __future__ import annotations

import gc

import pytest
import torch

from hone.core.bench.measure import (
    Settings,
    SkipRun,
    count_syncs,
    is_out_of_memory,
    matmul_rate,
    measure_run,
    mfu_roof,
)
from hone.core.errors import ConfigError


def settings(**kw) -> Settings:
    return Settings(**{"warmup": 2, "steps": 3, "device": "cpu", "tokens": 1000, "peak_flops": 1e9, **kw})


def test_warmup_then_timed_steps_give_median_throughput_and_first_step_loss(double_runner):
    runner = double_runner()
    result = measure_run(runner, settings(), description="d", overrides={"loss": "chunked"})
    assert result.status == "ok", result.reason
    assert runner.calls == {"setup": 1, "step": 5, "forward_backward": 0, "teardown": 1}  # syncs: CUDA only
    assert result.first_loss == 3.0 and result.first_grad_norm == 30.0  # the very first (warm-up) step
    assert result.last_loss == 1.0 and len(result.step_times_s) == 3
    assert result.tokens_per_s == pytest.approx(1000 / sorted(result.step_times_s)[1])
    assert result.mfu == pytest.approx(6 * 1000 * 1000 / result.median_step_s / 1e9)
    assert result.speed_paths == {"attention": "double"} and result.trainable_params == 7
    assert result.overrides == {"loss": "chunked"} and result.description == "d"
    assert result.syncs_fwd_bwd is None and result.peak_allocated_gib is None  # not measurable on a CPU


def test_the_host_memory_a_step_offloaded_to_is_recorded_where_the_run_reports_it(double_runner):
    """Hone's runs report the layer inputs a step moved to host memory (long rows need it planned); a run that does
    not report it leaves the field empty."""
    from hone.core.bench.max_length import trial_of

    result = measure_run(double_runner(offload_bytes=3 << 30), settings(warmup=0, steps=1))
    assert result.offload_gib == 3.0 and trial_of(result).host_gib == 3.0
    assert measure_run(double_runner(), settings(warmup=0, steps=1)).offload_gib is None


def test_without_warmup_the_first_timed_step_gives_the_first_loss(double_runner):
    result = measure_run(double_runner(), settings(warmup=0, steps=2))
    assert result.first_loss == 3.0 and result.last_loss == 2.5


def test_out_of_memory_is_recorded_and_the_run_memory_released(double_runner):
    runner = double_runner(
        "big",
        fail_at=4,
        error=torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 139.8 GiB total capacity)"
        ),
    )
    result = measure_run(runner, settings())
    assert result.status == "oom"
    assert result.reason.startswith("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert result.tokens_per_s is None and result.mfu is None and result.details == ""
    assert runner.calls["teardown"] == 1
    gc.collect()
    assert runner.weights_ref() is None, "the run's model must be freed before the next run starts"
    assert runner.activations_ref() is None, "tensors alive when the error was raised must be freed too"
    after = measure_run(double_runner("next"), settings())
    assert after.status == "ok"


def test_other_failures_are_recorded_with_their_traceback(double_runner):
    result = measure_run(double_runner(fail_at=1, error=ValueError("shapes do not match")), settings())
    assert result.status == "failed" and result.reason == "ValueError: shapes do not match"
    assert "Traceback" in result.details and "ValueError" in result.details


@pytest.mark.parametrize("error", [SkipRun("needs a CUDA GPU"), ConfigError("needs a CUDA GPU", "use auto")])
def test_a_path_that_cannot_run_here_is_skipped(double_runner, error):
    result = measure_run(double_runner(fail_at=1, error=error), settings())
    assert result.status == "skipped" and result.reason == "needs a CUDA GPU"


def test_out_of_memory_is_recognized_in_its_forms():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_syncs_are_not_counted_off_cuda_and_the_matmul_rate_is_measured():
    assert count_syncs(lambda: None, "cpu") is None
    rate = matmul_rate("cpu", torch.float32)
    assert 1e6 < rate < 1e14, f"{rate:.3g} FLOP/s is not a CPU's float32 matmul rate"


def test_a_cpu_gets_no_mfu_roof_unless_one_is_given(monkeypatch):
    import hone.core.bench.measure as measure

    def probe(*_):
        raise AssertionError("a CPU's matmul rate must not be probed")

    monkeypatch.setattr(measure, "matmul_rate", probe)
    roof = mfu_roof("cpu", torch.float32)
    assert (roof.flops, roof.source) == (None, "none")
    assert roof.note.startswith("no MFU on a CPU") and "--peak-flops" in roof.note
    assert roof.to_dict() == {"tflops": None, "source": "none", "note": roof.note}
    given = mfu_roof("cpu", torch.float32, given=2e12)
    assert (given.flops, given.source, given.to_dict()["tflops"]) == (2e12, "given", 2.0)
    assert "2 TFLOP/s (--peak-flops)" in given.note


def test_without_a_roof_a_run_has_no_mfu(double_runner):
    result = measure_run(double_runner(), settings(peak_flops=None))
    assert result.status == "ok" and result.tokens_per_s > 0
    assert result.mfu is None


def test_a_scaled_step_reports_and_applies_the_unscaled_gradient():
    """float16 runs step through a loss scaler (as transformers' Trainer with fp16=True): the gradient norm and the
    update are those of the unscaled loss."""
    from hone.core.bench.measure import loss_scaler, optimizer_step

    assert loss_scaler(torch.bfloat16, "cuda") is None and loss_scaler(torch.float16, "cpu") is None
    results = []
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=2.0**12)):
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 4)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        loss = layer(torch.randn(16, 8)).square().mean()
        norm = optimizer_step(loss, list(layer.parameters()), optimizer, scaler, max_norm=1e9)
        results.append((norm, layer.weight.detach().clone()))
        assert all(p.grad is None for p in layer.parameters())
    (plain_norm, plain_weight), (scaled_norm, scaled_weight) = results
    assert scaled_norm == pytest.approx(plain_norm, rel=1e-6)
    torch.testing.assert_close(scaled_weight, plain_weight)

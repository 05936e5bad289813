"""MoE on a CUDA GPU (`pytest -m gpu`): auto choice, every backend against eager + peft on tiny models, no host
sync in the grouped_mm and Triton paths, and a benchmark smoke run on the real Qwen3-30B-A3B expert shape."""

from __future__ import annotations

import pytest
import torch
from moe_testing import add_lora, build_tiny_moe, token_batch

from hone.core.speed import moe

pytestmark = pytest.mark.gpu

GPU_BACKENDS = ["grouped_mm", "triton", "torch"]


@pytest.fixture(autouse=True)
def _cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.delenv(moe.ENV_VAR, raising=False)


def _usable(backend: str, dtype: torch.dtype) -> str | None:
    """Why a backend cannot run here (then the test is skipped with that reason), or None."""
    if backend == "torch":
        return None
    if backend == "triton":
        from hone.kernels.moe.grouped_gemm.launch import triton_runs_on

        if not triton_runs_on("cuda"):
            return "Triton is not installed"
    return moe.probe(backend, torch.device("cuda", torch.cuda.current_device()), dtype)


def test_auto_picks_a_gpu_backend_and_says_why():
    model = build_tiny_moe("tiny-moe-qwen3", layers=1).to("cuda", torch.bfloat16)
    choice = moe.configure(model, "auto")
    print(f"auto -> {choice.name}: {choice.reason}")
    assert choice.name in ("grouped_mm", "triton"), choice
    assert torch.cuda.get_device_name() in choice.reason


def _train(shape: str, backend: str, dtype: torch.dtype, steps: int = 3):
    model = build_tiny_moe(shape).to("cuda", dtype)
    peft_model = add_lora(model, random_b=False)
    if backend == "eager":
        moe.apply_backend(peft_model, "eager")
    else:
        moe.install_split_lora(peft_model)
        assert moe.configure(peft_model, backend).name == backend
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=2.0)
    ids = token_batch(seed=2, batch=4, length=64).cuda()
    losses = []
    for _ in range(steps):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", ["tiny-moe-qwen3", "tiny-moe-gptoss", "tiny-moe-qwen2"])
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_training_on_gpu_matches_eager_with_peft(backend, shape, dtype):
    why_not = _usable(backend, dtype)
    if why_not:
        pytest.skip(f"{backend} does not run in {dtype} here: {why_not}")
    reference = _train(shape, "eager", dtype)
    losses = _train(shape, backend, dtype)
    rel = 1e-4 if dtype == torch.float32 else 2e-2  # bf16: 8-bit mantissa, different summation orders
    assert losses == pytest.approx(reference, rel=rel), f"{shape} {backend} {dtype}: {losses} vs eager {reference}"


@pytest.mark.parametrize("backend", ["grouped_mm", "triton"])
def test_no_host_sync_in_forward_and_backward(backend):
    """The experts layer with split LoRA runs forward and backward without a device-to-host sync."""
    dtype = torch.bfloat16
    why_not = _usable(backend, dtype)
    if why_not:
        pytest.skip(f"{backend} does not run here: {why_not}")
    model = build_tiny_moe(
        "tiny-moe-qwen3", layers=1, hidden_size=256, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4
    ).to("cuda", dtype)
    peft_model = add_lora(model, rank=16)
    moe.install_split_lora(peft_model)
    moe.configure(peft_model, backend)
    experts = peft_model.base_model.model.model.layers[0].mlp.experts  # the outermost LoRA wrapper
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(512, 256, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    scores = torch.rand(512, 16, device="cuda", generator=gen)
    weights, index = scores.topk(4, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype).requires_grad_(True)
    grad_out = torch.randn(512, 256, device="cuda", dtype=dtype, generator=gen)

    def step():
        experts(hidden, index, weights).backward(grad_out)

    step()  # compiles kernels and tunes block sizes (which synchronizes, once per shape)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.isfinite(hidden.grad).all()


def test_benchmark_smoke_on_the_qwen3_30b_expert_shape():
    """Two layers of the real moe-qwen3 shape, 2,048 tokens: every backend runs; the first loss (before any
    update, LoRA B = 0) is the same for all."""
    from hone.core.bench.moe_backends import run_moe_benchmark

    results = {}
    for backend in ("grouped_mm", "triton", "hf_grouped_mm"):
        if backend in GPU_BACKENDS and _usable(backend, torch.bfloat16):
            continue
        results[backend] = run_moe_benchmark("moe-qwen3", backend, layers=2, tokens=2048, steps=2, warmup=1)
        torch.cuda.empty_cache()
    for name, r in results.items():
        print(f"{name:>14} {r.tokens_per_s:>10,.0f} tokens/s {r.peak_bytes / 2**30:6.1f} GiB  {r.reason}")
    first = {name: r.losses[0] for name, r in results.items()}
    assert all(abs(v - first["hf_grouped_mm"]) < 2e-2 * abs(first["hf_grouped_mm"]) for v in first.values()), first

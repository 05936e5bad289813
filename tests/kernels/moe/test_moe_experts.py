"""The experts layer with split LoRA, on each grouped-GEMM backend, against a plain-autograd float32 reference
that forms W + scale * A @ B expert by expert: outputs and gradients of the input, the routing weights, the LoRA
factors and the base weights and biases, over a grid of routing patterns and dtypes.

The backward is also checked against finite differences (float64 gradcheck), dropout included.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hone.kernels.moe.backends import make_ops
from hone.kernels.moe.clamped_glu import ClampedGlu
from hone.kernels.moe.experts import ExpertWeights, LoraFactors, moe_experts, moe_experts_reference
from hone.kernels.moe.grouped_gemm.launch import interpreting, triton_runs_on

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}  # relative to the largest value
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _untuned_triton(monkeypatch):
    """Triton block sizes from the heuristic: tuning every test shape would spend GPU minutes compiling."""
    monkeypatch.setenv("HONE_TRITON_AUTOTUNE", "0")


def qwen_activation(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gptoss_activation(gate_up: torch.Tensor, limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    gate, up = gate_up[..., ::2].clamp(max=limit), gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


# name, experts, tokens, top_k, hidden, intermediate, rank, routing pattern, layout
CASES = [
    ("prime5_empty_expert", 5, 9, 2, 24, 16, 4, "skip1", "qwen"),
    ("prime7_topk_equals_experts", 7, 4, 7, 16, 8, 3, "all", "qwen"),
    ("top1_all_to_one", 3, 6, 1, 16, 8, 2, "one", "gptoss"),
    ("odd_hidden_gptoss", 4, 7, 2, 33, 13, 5, "random", "gptoss"),
]


def _routing(pattern: str, experts: int, tokens: int, top_k: int, gen: torch.Generator):
    if pattern == "one":
        index = torch.full((tokens, top_k), experts - 1)
    elif pattern == "all":
        index = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
    else:
        pool = [e for e in range(experts) if not (pattern == "skip1" and e == 1)]
        index = torch.stack(
            [torch.tensor(pool)[torch.randperm(len(pool), generator=gen)[:top_k]] for _ in range(tokens)]
        )
    weights = torch.rand(tokens, top_k, generator=gen)
    return index, weights / weights.sum(-1, keepdim=True)


def _problem(case, dtype: torch.dtype, device: str):
    """Leaf tensors (in `dtype` on `device`) and the routing of one case."""
    _, experts, tokens, top_k, hidden, inter, rank, pattern, layout = case
    gen = torch.Generator().manual_seed(sum(map(ord, case[0])))

    def rnd(*shape, std=0.3):
        return (torch.randn(*shape, generator=gen) * std).to(device, dtype).requires_grad_(True)

    leaves = {
        "x": rnd(tokens, hidden, std=1.0),
        "up": rnd(experts, 2 * inter, hidden),
        "down": rnd(experts, hidden, inter),
    }
    if layout == "gptoss":
        leaves["up_bias"], leaves["down_bias"] = rnd(experts, 2 * inter), rnd(experts, hidden)
    leaves |= {
        "a1": rnd(experts, hidden, rank),
        "b1": rnd(experts, rank, 2 * inter),
        "a2": rnd(experts, inter, rank),
        "b2": rnd(experts, rank, hidden),
    }
    index, weights = _routing(pattern, experts, tokens, top_k, gen)
    leaves["routing_weights"] = weights.to(device).requires_grad_(True)
    return leaves, index.to(device), layout


def _run(fn, leaves: dict, index: torch.Tensor, layout: str, grad_out: torch.Tensor, fused: bool = False):
    """`fused`: the layout's gate through its fused kernels (Qwen's silu halves, gpt-oss's clamped GLU)."""
    activation = gptoss_activation if layout == "gptoss" else qwen_activation
    # Qwen stores (E, out, in): pass transposed views, as the transformers glue does.
    weights = ExpertWeights(
        up=leaves["up"].transpose(1, 2),
        down=leaves["down"].transpose(1, 2),
        up_bias=leaves.get("up_bias"),
        down_bias=leaves.get("down_bias"),
        activation=activation,
        silu_halves=fused and layout == "qwen",
        clamped_glu=ClampedGlu(alpha=1.702, limit=7.0) if fused and layout == "gptoss" else None,
    )
    out = fn(
        leaves["x"],
        index,
        leaves["routing_weights"],
        weights,
        LoraFactors(leaves["a1"], leaves["b1"], 0.75),
        LoraFactors(leaves["a2"], leaves["b2"], 1.25),
    )
    out.backward(grad_out.to(out.dtype))
    return out, {name: t.grad for name, t in leaves.items()}


def _check(backend: str, case, dtype: torch.dtype, device: str, fused: bool = False) -> None:
    leaves, index, layout = _problem(case, dtype, device)
    reference_leaves = {k: v.detach().float().requires_grad_(True) for k, v in leaves.items()}
    grad_out = torch.randn(leaves["x"].shape, generator=torch.Generator().manual_seed(5)).to(device)
    ref_out, ref_grads = _run(
        lambda *a: moe_experts_reference(*a[:4], lora_up=a[4], lora_down=a[5]),
        reference_leaves,
        index,
        layout,
        grad_out,
    )
    out, grads = _run(
        lambda *a: moe_experts(*a[:4], make_ops(backend), lora_up=a[4], lora_down=a[5]),
        leaves,
        index,
        layout,
        grad_out,
        fused,
    )
    assert out.dtype == dtype and out.shape == ref_out.shape
    tol = TOLERANCE[dtype]
    errors = {"output": ((out.float() - ref_out).abs().max() / ref_out.abs().max()).item()}
    for name, ref in ref_grads.items():
        got = grads[name]
        assert got is not None, f"no gradient for {name}"
        errors[name] = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"{backend} {case[0]} {dtype} (fused gate: {fused}): relative errors above {tol}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_cpu_backends_match_reference(backend, case, dtype):
    """torch._grouped_mm has a CPU kernel from torch 2.9; odd sizes fall back to the loop inside GroupedMmOps."""
    _check(backend, case, dtype, "cpu")


def _check_in_column_blocks(monkeypatch, backend: str, case) -> None:
    """A budget of one 16-column block: hidden 24 / 33 takes 2 / 3 blocks (the last one narrower), bias sliced too."""
    from hone.kernels.moe import experts as module

    monkeypatch.setattr(module, "SUM_BLOCK_BYTES", 1)
    widths = []
    original = module._gmm_summed_over_slots

    def counted(ops, x, w, *args, **kwargs):
        widths.append(w.shape[2])
        return original(ops, x, w, *args, **kwargs)

    monkeypatch.setattr(module, "_gmm_summed_over_slots", counted)
    _check(backend, case, torch.float32, "cpu")
    assert len(widths) == 2 and all(n > 16 for n in widths)  # forward's down projection and backward's dx


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=lambda c: c[0])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_output_and_input_gradient_made_a_column_block_at_a_time(monkeypatch, backend, case):
    _check_in_column_blocks(monkeypatch, backend, case)


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=lambda c: c[0])
def test_column_blocks_triton_interpreter(monkeypatch, case):
    if not interpreting():
        pytest.skip("CPU runs need TRITON_INTERPRET=1 at import (test_moe_triton_cpu.py runs them)")
    _check_in_column_blocks(monkeypatch, "triton", case)


QWEN_CASES = [c for c in CASES if c[-1] == "qwen"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", QWEN_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_fused_silu_gate_matches_reference(backend, case, dtype):
    """Qwen-style experts with the fused activation forward / backward (`moe_glu`, its torch form on the CPU)."""
    _check(backend, case, dtype, "cpu", fused=True)


GPTOSS_CASES = [c for c in CASES if c[-1] == "gptoss"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", GPTOSS_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm"])
def test_fused_gptoss_gate_matches_reference(backend, case, dtype):
    """gpt-oss experts with the fused clamped GLU forward / backward (its torch form on the CPU)."""
    _check(backend, case, dtype, "cpu", fused=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", [QWEN_CASES[0], GPTOSS_CASES[1]], ids=lambda c: c[0])
def test_fused_gates_triton_match_reference_interpreter(case, dtype):
    if not interpreting():
        pytest.skip("CPU runs need TRITON_INTERPRET=1 at import (test_moe_triton_cpu.py runs them)")
    _check("triton", case, dtype, "cpu", fused=True)


# Under the interpreter each case runs in one dtype (the kernel grid in test_grouped_gemm.py covers all three).
@pytest.mark.parametrize(
    ("case", "dtype"),
    list(zip(CASES, [torch.bfloat16, torch.float32, torch.float16, torch.bfloat16], strict=True)),
    ids=lambda v: v[0] if isinstance(v, tuple) else str(v).removeprefix("torch."),
)
def test_triton_backend_matches_reference_interpreter(case, dtype):
    if not interpreting():
        pytest.skip("CPU runs need TRITON_INTERPRET=1 at import (test_moe_triton_cpu.py runs them)")
    _check("triton", case, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True], ids=["module-gate", "fused-gate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("backend", ["torch", "grouped_mm", "triton"])
def test_gpu_backends_match_reference(backend, case, dtype, fused):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if backend == "triton" and not triton_runs_on("cuda"):
        pytest.skip("Triton not installed")
    if backend == "grouped_mm":
        from hone.core.speed.moe.choice import probe

        failure = probe("grouped_mm", torch.device("cuda", torch.cuda.current_device()), dtype)
        if failure is not None:
            pytest.skip(f"torch._grouped_mm does not run in {dtype} on this GPU ({failure}); auto would not pick it")
    _check(backend, case, dtype, "cuda", fused=fused)


@pytest.mark.parametrize("silu_halves", [False, True], ids=["generic-activation", "fused-silu-gate"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_backward_matches_finite_differences(dropout, silu_halves):
    """float64 gradcheck of every input (the same dropout masks on each call: the seed comes from torch's RNG)."""
    torch.manual_seed(0)
    experts, tokens, top_k, hidden, inter, rank = 3, 5, 2, 6, 4, 2
    index = torch.tensor([[0, 2], [2, 0], [0, 2], [2, 1], [0, 2]])  # expert 1 gets one row

    def rnd(*shape):
        return torch.randn(*shape, dtype=torch.float64).mul(0.5).requires_grad_(True)

    inputs = (
        rnd(tokens, hidden),
        torch.rand(tokens, top_k, dtype=torch.float64).requires_grad_(True),
        rnd(experts, hidden, 2 * inter),
        rnd(experts, 2 * inter),
        rnd(experts, inter, hidden),
        rnd(experts, hidden),
        rnd(experts, hidden, rank),
        rnd(experts, rank, 2 * inter),
        rnd(experts, inter, rank),
        rnd(experts, rank, hidden),
    )

    def layer(x, w, up, up_b, down, down_b, a1, b1, a2, b2):
        torch.manual_seed(1)
        weights = ExpertWeights(up, down, up_b, down_b, qwen_activation, silu_halves=silu_halves)
        return moe_experts(
            x,
            index,
            w,
            weights,
            make_ops("torch"),
            lora_up=LoraFactors(a1, b1, 0.5, dropout),
            lora_down=LoraFactors(a2, b2, 2.0, dropout),
            training=True,
        )

    assert torch.autograd.gradcheck(layer, inputs, eps=1e-6, atol=1e-5, fast_mode=True)

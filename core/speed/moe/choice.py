"""Which MoE backend a run uses, and why: `auto` probes, the config field or HONE_MOE_BACKEND can force one.

auto: on a CUDA GPU, the first backend of `backend_order(capability)` that passes a one-time tiny probe (a grouped
product and its weight gradient, checked against float32 math in the model's dtype): Hone's Triton kernels first
where they were measured fastest (Hopper), `grouped_mm` first elsewhere; Triton needs sm75+. If neither passes,
`torch`. On a CPU, `torch`. A forced backend that cannot run here is an error that says what to pick instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from hone.core.errors import ConfigError
from hone.core.resources import cache_root
from hone.core.speed.moe.experts import apply_backend, find_experts, set_fused_gate, unsupported_reason
from hone.kernels.moe.backends import GroupedOps, make_ops
from hone.kernels.moe.grouped_gemm import tuning
from hone.kernels.moe.routing import route

BACKENDS = ("auto", "grouped_mm", "triton", "torch", "eager")
# GPU generations (compute capability major) where Hone's Triton kernels beat torch._grouped_mm in a whole training
# step, measured with `hone bench moe-qwen3` on sm90 (docs/performance/moe.md; gather, LoRA, routing weight and
# scatter fused into the GEMMs). Elsewhere grouped_mm (CUTLASS) goes first.
TRITON_FIRST_MAJORS = frozenset({9})
ENV_VAR = "HONE_MOE_BACKEND"
_probe_results: dict[tuple, str | None] = {}


@dataclass(frozen=True)
class Choice:
    """The MoE backend in use. name: grouped_mm | triton | torch | eager | none; reason: one line for people."""

    name: str
    reason: str


def probe(backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Run one tiny grouped product and weight gradient on `backend`; None if it matches float32 math, else why not.

    Groups are uneven and one is empty. The result is remembered per (backend, device, dtype) for the process.
    """
    key = (backend, str(device), dtype)
    if key in _probe_results:
        return _probe_results[key]
    try:
        failure = _probe(make_ops(backend), device, dtype)
    except Exception as exc:  # any failure to run means "not usable here", with its message
        failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    _probe_results[key] = failure
    return failure


def _probe(ops: GroupedOps, device: torch.device, dtype: torch.dtype) -> str | None:
    gen = torch.Generator().manual_seed(0)
    # 4 experts, expert 2 gets no rows, sizes multiples of 16 bytes in every dtype (what real layers have).
    index = torch.tensor([0, 1, 3, 0, 0, 3, 1, 0, 3, 3, 0, 1] * 4).view(-1, 2)
    routing = route(index.to(device), 4)
    x = torch.randn(index.shape[0], 64, generator=gen).to(device, dtype)
    # Both weight layouts models use: (E, K, N) contiguous (gpt-oss) and an (E, N, K) parameter seen transposed.
    weights = {
        "(E, K, N)": torch.randn(4, 64, 32, generator=gen).to(device, dtype),
        "transposed": torch.randn(4, 32, 64, generator=gen).to(device, dtype).transpose(1, 2),
    }
    rows = x[routing.token].float()
    tol = 1e-3 if dtype == torch.float32 else 5e-2  # relative to the largest value; bf16 keeps 8 bits
    for layout, w in weights.items():
        out = ops.gmm(x, w, routing, gather=True).float()
        grad = ops.wgrad(x, out.to(dtype), routing, gather_p=True).float()
        expected = torch.cat([rows[b:e] @ w[i].float() for i, (b, e) in enumerate(routing.bounds())])
        expected_grad = torch.stack([rows[b:e].T @ out[b:e] for b, e in routing.bounds()])
        for label, got, ref in (("output", out, expected), ("weight gradient", grad, expected_grad)):
            err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            if not err <= tol:
                return f"{label} off by {err:.2g} (relative) in {str(dtype).removeprefix('torch.')}, {layout} weights"
    return None


def _model_dtype_device(experts: nn.Module) -> tuple[torch.dtype, torch.device]:
    weight = experts.down_proj
    return weight.dtype, weight.device


def _gpu_label(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm{major}{minor})"


def backend_order(capability: tuple[int, int]) -> tuple[str, ...]:
    """The GPU backends `auto` tries, best first, on a GPU of this compute capability."""
    if capability < (7, 5):
        return ("grouped_mm",)  # Hone's Triton kernels need sm75+
    return ("triton", "grouped_mm") if capability[0] in TRITON_FIRST_MAJORS else ("grouped_mm", "triton")


def _auto(device: torch.device, dtype: torch.dtype) -> Choice:
    dtype_name = str(dtype).removeprefix("torch.")
    if device.type != "cuda":
        return Choice("torch", f"auto: {device.type} device, so the PyTorch loop over expert groups")
    gpu = _gpu_label(device)
    capability = torch.cuda.get_device_capability(device)
    why_not: list[str] = []
    for name in backend_order(capability):
        if name == "triton":
            from hone.kernels.moe.grouped_gemm.launch import triton_runs_on

            if not triton_runs_on(device):
                why_not.append("Triton is not installed")
                continue
        failure = probe(name, device, dtype)
        if failure is None:
            first = "" if not why_not else f" ({'; '.join(why_not)})"
            what = "Hone's Triton grouped GEMMs" if name == "triton" else "torch._grouped_mm"
            rank = "fastest measured on this GPU generation, " if name == "triton" else ""
            return Choice(name, f"auto: {what} ({rank}passed the probe) on {gpu} in {dtype_name}{first}")
        why_not.append(f"{name} failed the probe ({failure})")
    if capability < (7, 5):
        why_not.append("Triton kernels need sm75+")
    return Choice("torch", f"auto: {'; '.join(why_not)}; the PyTorch loop on {gpu}")


def _forced(name: str, source: str, device: torch.device, dtype: torch.dtype) -> Choice:
    where = f"{device.type}" if device.type != "cuda" else _gpu_label(device)
    if name in ("torch", "eager"):
        what = "PyTorch loop over expert groups" if name == "torch" else "transformers' eager loop (reference)"
        return Choice(name, f"{source}: {what} on {where}")
    if name == "triton":
        from hone.kernels.moe.grouped_gemm.launch import triton_runs_on

        if not triton_runs_on(device):
            raise ConfigError(
                f"{source} asks for the triton MoE backend, but Hone's Triton kernels cannot run on {where}",
                'use moe_backend = "auto" (or torch); Triton needs an NVIDIA GPU (sm75+)',
            )
    failure = probe(name, device, dtype)
    if failure is not None:
        raise ConfigError(
            f"{source} asks for the {name} MoE backend, but it does not work on {where} in "
            f"{str(dtype).removeprefix('torch.')}: {failure}",
            'use moe_backend = "auto" to pick one that works here',
        )
    return Choice(name, f"{source}: passed the probe on {where}")


def configure(
    model: nn.Module, backend: str = "auto", device: torch.device | str | None = None, *, fused_gate: bool = True
) -> Choice:
    """Pick the MoE backend and set it as the model's experts implementation (undo with `revert_backend`). The Triton
    kernels are told to keep their tuned block sizes in the user cache (`cache_root("triton")`).

    Args:
        model: a transformers model or a peft model around one.
        backend: SpeedConfig.moe_backend: auto | grouped_mm | triton | torch | eager. The environment variable
            HONE_MOE_BACKEND, when set, overrides it.
        device: where the experts run (default: where their weights are).
        fused_gate: Hone's backends run a silu gate on concatenated halves (Qwen-style experts) as one fused kernel
            in forward and backward (`hone.kernels.moe.glu`); False keeps transformers' activation code.

    Returns:
        The Choice (name and reason, for RunStarted.speed_paths["moe"] and the GUI). A model without experts gives
        Choice("none", ...) and is left as it is.
    """
    env = os.environ.get(ENV_VAR, "").strip()
    source = f"{ENV_VAR}={env}" if env else ("speed.moe_backend" if backend != "auto" else "auto")
    requested = env or backend
    if requested not in BACKENDS:
        field = ENV_VAR if env else "speed.moe_backend"
        raise ConfigError(
            f"{field} is {requested!r}, which is not an MoE backend", f"use one of: {', '.join(BACKENDS)}"
        )
    experts = find_experts(model)
    if not experts:
        return Choice("none", "the model has no mixture-of-experts layers")
    set_fused_gate(model, fused_gate)
    reasons = {r for _, m in experts if (r := unsupported_reason(m)) is not None}
    dtype, weight_device = _model_dtype_device(experts[0][1])
    device = torch.device(device) if device is not None else weight_device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if reasons and requested != "eager":
        apply_backend(model, "eager")
        return Choice("eager", f"transformers' eager experts: {sorted(reasons)[0]}")
    tuning.set_cache_dir(cache_root("triton"))  # before the probe: it may run (and tune) the Triton kernels
    choice = _auto(device, dtype) if requested == "auto" else _forced(requested, source, device, dtype)
    apply_backend(model, choice.name)
    return choice

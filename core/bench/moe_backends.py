"""Per-backend MoE training-step benchmark: one shape, one experts backend, LoRA on attention and experts.

`run_moe_benchmark(shape, backend)` trains a few steps on one row of random tokens and reports tokens/s, peak memory
and the losses, for Hone's experts backends ("grouped_mm", "triton", "torch", split LoRA on the experts) and the
transformers + peft references ("hf_grouped_mm", "hf_eager": peft's W + BA on the experts). The MoE GPU smoke test
uses it, and `python -m hone.core.bench.moe_backends --shape moe-qwen3` prints a table over the backends.
`hone bench moe-qwen3` does not call it: its `moe-*` runs (`variants`) go through Hone's trainer step.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from hone.core.moe.choice import Choice, configure
from hone.core.moe.expert_lora import expert_lora_targets, install_split_lora
from hone.core.moe.experts import apply_backend

HONE_BACKENDS = ("grouped_mm", "triton", "torch")
REFERENCE_BACKENDS = {"hf_grouped_mm": "grouped_mm", "hf_eager": "eager"}
ATTENTION_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class MoeBenchResult:
    shape: str
    backend: str
    reason: str
    layers: int
    tokens: int
    steps: int
    tokens_per_s: float
    peak_bytes: int
    step_times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def prepare_moe_lora(model: nn.Module, backend: str, *, rank: int = 16, alpha: float = 32.0,
                     targets: list[str] | None = None, device: torch.device | str | None = None) -> tuple[nn.Module,
                                                                                                      Choice]:
    """Put LoRA on attention and experts and select a backend (see the module docstring for the names).

    Returns:
        (peft model, Choice).
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets or ATTENTION_TARGETS,
                        target_parameters=expert_lora_targets(model))
    peft_model = get_peft_model(model, config)
    if backend in REFERENCE_BACKENDS:
        apply_backend(peft_model, REFERENCE_BACKENDS[backend])
        return peft_model, Choice(backend, f"transformers {REFERENCE_BACKENDS[backend]} + peft W + BA (reference)")
    install_split_lora(peft_model)
    return peft_model, configure(peft_model, backend, device)


def run_moe_benchmark(shape: str = "moe-qwen3", backend: str = "grouped_mm", *, layers: int = 8,
                      tokens: int = 8192, steps: int = 8, warmup: int = 2, rank: int = 16,
                      device: str = "cuda", dtype: torch.dtype = torch.bfloat16, checkpointing: bool = False,
                      seed: int = 0) -> MoeBenchResult:
    """Train `warmup + steps` steps on one packed row of random tokens; time the last `steps`.

    Args:
        shape: a name from `hone.core.models.shapes.SHAPES` (moe-qwen3, moe-gptoss, or a tiny one).
        backend: grouped_mm | triton | torch | hf_grouped_mm | hf_eager.
        layers: decoder layers to build (the shape's own count when 0).
        tokens: tokens per step (one row).
        checkpointing: transformers' gradient checkpointing on the decoder layers.

    Returns:
        Tokens per second over the timed steps, peak allocated memory, per-step times and losses.
    """
    from hone.core.models.shapes import build_model

    model = build_model(shape, layers or None, seed=seed, dtype=dtype, device=device)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    peft_model, choice = prepare_moe_lora(model, backend, rank=rank, device=device)
    peft_model.train()
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=torch.device(device).type == "cuda")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=gen).to(device)
    cuda = torch.device(device).type == "cuda"
    times, losses = [], []
    for step in range(warmup + steps):
        if step == warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes: the step is done
        if step >= warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return MoeBenchResult(shape=shape, backend=backend, reason=choice.reason, layers=layers, tokens=tokens,
                          steps=steps, tokens_per_s=tokens * len(times) / sum(times), peak_bytes=peak,
                          step_times=times, losses=losses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="moe-qwen3")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backends", default=",".join((*HONE_BACKENDS[:2], *REFERENCE_BACKENDS)))
    args = parser.parse_args(argv)
    rows = []
    for backend in args.backends.split(","):
        try:
            dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
            result = run_moe_benchmark(args.shape, backend, layers=args.layers, tokens=args.tokens,
                                       steps=args.steps, warmup=args.warmup, checkpointing=args.checkpointing,
                                       device=args.device, dtype=dtype)
            rows.append(result)
            print(f"{backend:>14}  {result.tokens_per_s:>10,.0f} tokens/s  {result.peak_bytes / 2**30:6.1f} GiB  "
                  f"loss {result.losses[-1]:.4f}  ({result.reason})", flush=True)
        except Exception as exc:  # report and go on to the next backend
            print(f"{backend:>14}  failed: {type(exc).__name__}: {exc}", flush=True)
        gc.collect()  # the previous backend's model holds reference cycles (peft); free it before the next
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())

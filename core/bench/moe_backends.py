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

from hone.core.speed.moe.choice import Choice, configure
from hone.core.speed.moe.expert_lora import expert_lora_targets, install_split_lora
from hone.core.speed.moe.experts import apply_backend

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


def prepare_moe_lora(
    model: nn.Module,
    backend: str,
    *,
    rank: int = 16,
    alpha: float = 32.0,
    targets: list[str] | None = None,
    device: torch.device | str | None = None,
) -> tuple[nn.Module, Choice]:
    """Put LoRA on attention and experts and select a backend (see the module docstring for the names).

    Returns:
        (peft model, Choice).
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=targets or ATTENTION_TARGETS,
        target_parameters=expert_lora_targets(model),
    )
    peft_model = get_peft_model(model, config)
    if backend in REFERENCE_BACKENDS:
        apply_backend(peft_model, REFERENCE_BACKENDS[backend])
        return peft_model, Choice(backend, f"transformers {REFERENCE_BACKENDS[backend]} + peft W + BA (reference)")
    install_split_lora(peft_model)
    return peft_model, configure(peft_model, backend, device)


def run_moe_benchmark(
    shape: str = "moe-qwen3",
    backend: str = "grouped_mm",
    *,
    layers: int = 8,
    tokens: int = 8192,
    steps: int = 8,
    warmup: int = 2,
    rank: int = 16,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    checkpointing: bool = False,
    seed: int = 0,
) -> MoeBenchResult:
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
    return _timed_steps(
        model,
        shape,
        backend,
        layers=layers,
        tokens=tokens,
        steps=steps,
        warmup=warmup,
        rank=rank,
        device=device,
        checkpointing=checkpointing,
        seed=seed,
    )


def _timed_steps(
    model: nn.Module,
    shape: str,
    backend: str,
    *,
    layers: int,
    tokens: int,
    steps: int,
    warmup: int,
    rank: int,
    device: str,
    checkpointing: bool,
    seed: int,
) -> MoeBenchResult:
    """LoRA on `model` with `backend`, then `warmup + steps` steps on one row of random tokens; the last timed."""
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
    return MoeBenchResult(
        shape=shape,
        backend=backend,
        reason=choice.reason,
        layers=layers,
        tokens=tokens,
        steps=steps,
        tokens_per_s=tokens * len(times) / sum(times),
        peak_bytes=peak,
        step_times=times,
        losses=losses,
    )


def measure_model_backends(
    model_cfg, device: str, *, layers: int = 2, tokens: int = 4096, steps: int = 3, warmup: int = 1, progress=None
) -> list[MoeBenchResult | str]:
    """Hone's experts backends timed on the chosen model's own expert shapes: a random-init copy of its first
    `layers` decoder layers (its config, not its weights), LoRA on attention and experts. What the Train page's
    "Measure MoE backends" shows. Returns per backend its result, or why it could not run (a string).

    Args:
        model_cfg: the run's ModelConfig (a Hub id, folder or GGUF: only its config is read).
        progress: called with the backend about to run.
    """
    from transformers import AutoModelForCausalLM

    from hone.core.models.load import load_config

    _, _, config = load_config(model_cfg)
    if getattr(config, "vision_config", None) is not None:
        raise ValueError("measuring the MoE backends of vision-language models is not supported yet")
    config.num_hidden_layers = min(layers, config.num_hidden_layers)
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer kinds follow the layer count
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    for key in ("first_k_dense_replace", "moe_layer_start_index", "num_dense_layers"):  # every measured layer MoE
        if getattr(config, key, None):
            setattr(config, key, 0)
    if getattr(config, "mlp_only_layers", None):
        config.mlp_only_layers = []
    cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    names = HONE_BACKENDS if cuda else tuple(b for b in HONE_BACKENDS if b != "triton")
    out: list[MoeBenchResult | str] = []
    for backend in names:
        if progress is not None:
            progress(backend)
        try:
            torch.manual_seed(0)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            out.append(
                _timed_steps(
                    model,
                    getattr(config, "model_type", "model"),
                    backend,
                    layers=config.num_hidden_layers,
                    tokens=tokens,
                    steps=steps,
                    warmup=warmup,
                    rank=16,
                    device=device,
                    checkpointing=False,
                    seed=0,
                )
            )
        except Exception as exc:  # one backend failing (e.g. out of memory) leaves the others to compare
            out.append(f"{backend}: {type(exc).__name__}: {exc}")
        finally:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    return out


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
            result = run_moe_benchmark(
                args.shape,
                backend,
                layers=args.layers,
                tokens=args.tokens,
                steps=args.steps,
                warmup=args.warmup,
                checkpointing=args.checkpointing,
                device=args.device,
                dtype=dtype,
            )
            rows.append(result)
            print(
                f"{backend:>14}  {result.tokens_per_s:>10,.0f} tokens/s  {result.peak_bytes / 2**30:6.1f} GiB  "
                f"loss {result.losses[-1]:.4f}  ({result.reason})",
                flush=True,
            )
        except Exception as exc:  # report and go on to the next backend
            print(f"{backend:>14}  failed: {type(exc).__name__}: {exc}", flush=True)
        gc.collect()  # the previous backend's model holds reference cycles (peft); free it before the next
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""A full LoRA training step on one packed row: plain transformers + peft against Hone's attention and loss.

`run_step("dense-0.6b")` builds the shape (random init, peft LoRA on all linear layers, transformers' gradient
checkpointing) and times steps for each variant: reference (transformers' SDPA with its mask from position ids,
full logits), ours (the backend `hone.core.speed.attention.configure` picks + the chunked loss), ours_per_layer
(the same with the metadata rebuilt in every layer). `python -m hone.core.bench.attention_step` runs attention
alone (`hone.core.bench.attention`) and then these steps. Meaningful on a CUDA GPU; tiny shapes run on a CPU.
"""

from __future__ import annotations

import time

import torch

from hone.core.bench import attention as attention_alone
from hone.core.config import SpeedConfig
from hone.core.data.collate import collate_packed
from hone.core.speed import attention
from hone.core.train.loss import loss_sum

VARIANTS = ("reference", "ours", "ours_per_layer")


class _Row:
    def __init__(self, ids: list[int]):
        self.input_ids = ids
        self.labels = ids


def _packed_batch(tokens: int, vocab: int, seed: int, pin: bool):
    generator = torch.Generator().manual_seed(seed)
    lengths = attention_alone.packed_lengths(tokens, seed)
    rows = [_Row(torch.randint(0, vocab, (n,), generator=generator).tolist()) for n in lengths]
    return collate_packed(rows, pin_memory=pin)


def run_step(
    shape: str = "dense-0.6b",
    *,
    tokens: int = 16384,
    layers: int | None = None,
    variants: tuple[str, ...] = VARIANTS,
    steps: int = 5,
    warmup: int = 2,
    lora_rank: int = 16,
    checkpointing: bool = True,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> list[dict]:
    """Time LoRA training steps on one packed batch for each variant.

    Args:
        shape: a `hone.core.models.shapes.SHAPES` name. layers: keep only this many decoder layers (None = all).
        tokens: packed row length. steps / warmup: timed and untimed steps per variant.
        lora_rank: LoRA rank on every linear layer (alpha = 2 x rank).
        checkpointing: transformers' gradient checkpointing of the decoder layers (as in the reference runs).
        device: default CUDA when available.

    Returns:
        One dict per variant: variant, attention, attention_reason, loss_mode, tokens_per_s, step_ms, peak_gib,
        last_loss (mean over trained tokens).
    """
    from peft import LoraConfig, get_peft_model

    from hone.core.models.shapes import build_model

    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(shape, layers, dtype=dtype, device=device)
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear"))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = _packed_batch(tokens, model.config.vocab_size, seed, pin=device.type == "cuda").to(device)
    original = attention.current_implementation(model)

    results = []
    for variant in variants:
        attention.revert_attention(model, original)
        if variant == "reference":
            choice = attention.Choice("hf", "transformers' SDPA, mask from position ids", original, original)
        else:
            choice = attention.configure(
                model, SpeedConfig(attention="auto"), device, per_layer_metadata=variant == "ours_per_layer"
            )
        mode = "plain" if variant == "reference" else "chunked"

        def step(mode=mode):
            loss = loss_sum(model, batch, mode=mode)
            (loss / batch.num_trained).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        for _ in range(warmup):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
        results.append(
            {
                "shape": shape,
                "variant": variant,
                "attention": choice.name,
                "attention_reason": choice.reason,
                "loss_mode": mode,
                "tokens": batch.num_tokens,
                "tokens_per_s": steps * batch.num_tokens / elapsed,
                "step_ms": 1000.0 * elapsed / steps,
                "peak_gib": peak,
                "last_loss": float(loss.detach()) / batch.num_trained,
            }
        )
    attention.revert_attention(model, original)
    return results


def format_step_table(results: list[dict]) -> str:
    """Tokens/s, ratio to the reference and peak memory of each variant."""
    reference = next((r for r in results if r["variant"] == "reference"), None)
    lines = [
        f"{'shape':<12}{'variant':<16}{'attention':<11}{'loss':<9}{'tokens/s':>11}{'ratio':>8}"
        f"{'step ms':>10}{'peak GiB':>10}"
    ]
    for r in results:
        ratio = r["tokens_per_s"] / reference["tokens_per_s"] if reference else float("nan")
        lines.append(
            f"{r['shape']:<12}{r['variant']:<16}{r['attention']:<11}{r['loss_mode']:<9}"
            f"{r['tokens_per_s']:>11.0f}{ratio:>7.2f}x{r['step_ms']:>10.1f}{r['peak_gib']:>10.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m hone.core.bench.attention_step [--tokens N] [--window W] [--step SHAPE ...] [--json FILE]`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m hone.core.bench.attention_step",
        description="attention alone on one packed row, then full LoRA steps",
    )
    parser.add_argument("--tokens", type=int, default=16384, help="packed row length (default 16384)")
    parser.add_argument("--window", type=int, default=None, help="sliding window for the attention-alone run")
    parser.add_argument(
        "--step",
        nargs="*",
        default=[],
        metavar="SHAPE",
        help="also time full LoRA steps on these shapes (e.g. dense-0.6b dense-8b)",
    )
    parser.add_argument("--layers", type=int, default=None, help="decoder layers kept in the step runs")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant (default 5)")
    parser.add_argument("--json", default=None, help="also write every result to this JSON file")
    args = parser.parse_args(argv)

    alone = attention_alone.run(tokens=args.tokens, window=args.window)
    print(attention_alone.format_table(alone), flush=True)
    steps = []
    for shape in args.step:
        results = run_step(shape, tokens=args.tokens, layers=args.layers, steps=args.steps)
        print(format_step_table(results), flush=True)
        steps.extend(results)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"attention": alone, "steps": steps}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

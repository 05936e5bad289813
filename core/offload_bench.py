"""Measures the checkpoint modes on one CUDA GPU through the trainer's own step: steps/s, peak memory, the reload
buffers' device memory, pinned host memory, copy stalls.

    python -m hone.core.offload_bench --shape dense-8b --rows 8192 16384 --batch-tokens 16384

One random-init model of the shape (bf16, the packed-attention backend a run picks, LoRA r16 on every linear layer)
is built once; each mode is applied to it in turn (`apply_checkpointing` / `revert_checkpointing`) and runs
`warmup + steps` optimizer steps of packed rows of the given length (all tokens trained), through
`StepRunner.step` as in a real run.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

GIB = 2**30
BENCH_MODES = ("gpu", "offload", "offload-double")


@dataclass
class ModeResult:
    """One mode at one row length. Times and memory are means / maxima over the measured steps."""

    shape: str
    layers: int
    mode: str
    row_tokens: int
    batch_tokens: int
    steps_per_s: float
    tokens_per_s: float
    peak_gib: float  # peak allocated device memory during a step
    buffer_gib: float  # device memory of the reload buffers
    host_gib: float  # pinned host memory holding layer inputs
    copy_stall_ms: float  # per step, compute waiting for reloads
    offload_gib: float  # per step, layer inputs copied to the host
    mode_in_effect: str  # differs from `mode` after a fallback
    notes: list[str] = field(default_factory=list)


def _rows(count: int, length: int, vocab: int, seed: int):
    import torch

    from hone.core.data.tokenized import TokenizedRow

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        rows.append(TokenizedRow(input_ids=ids, labels=ids, source=f"bench:{i}"))
    return rows


def run_offload_bench(shape: str = "dense-8b", layers: int | None = None, row_tokens=(8192, 16384),
                      batch_tokens: int = 16384, modes=BENCH_MODES, steps: int = 4, warmup: int = 2,
                      rank: int = 16, device: str = "cuda", seed: int = 0) -> list[ModeResult]:
    """Run every mode at every row length; returns one ModeResult each (in the order run)."""
    import torch

    from hone.core.config import RunConfig
    from hone.core.lora import apply_lora
    from hone.core.models import count_params, info_from_config
    from hone.core.offload import apply_checkpointing, revert_checkpointing
    from hone.core.optim import build_optimizer, build_scheduler
    from hone.core.shapes import build_model
    from hone.core.speed import SpeedSetup, before_lora
    from hone.core.trainer import StepRunner

    model = build_model(shape, layers, seed=seed, dtype=torch.bfloat16, device=device)
    info = info_from_config(model.config, shape, "shape", count_params(model))
    config = RunConfig().with_overrides([f"train.batch_tokens={batch_tokens}", "model.dtype=bfloat16",
                                         f"lora.r={rank}", f"lora.alpha={2 * rank}", "train.max_steps=1000"])
    attention = before_lora(model, config.speed, info, device).choices["attention"]  # as a run does
    torch.manual_seed(seed)
    model, _report = apply_lora(model, config.lora, info)
    params = [p for p in model.parameters() if p.requires_grad]
    tokenizer = SimpleNamespace(pad_token_id=0)
    total = warmup + steps
    results = []
    for length in row_tokens:
        per_pack = max(1, batch_tokens // length)
        rows = _rows(total * per_pack, min(length, batch_tokens), info.vocab_size, seed)
        packs = [list(range(i * per_pack, (i + 1) * per_pack)) for i in range(total)]
        for mode in modes:
            notes: list[str] = [f"attention {attention}"]
            revert_checkpointing(model)
            checkpointer = None
            if mode != "off":
                checkpointer = apply_checkpointing(model, mode, device,
                                                   note=lambda _topic, message, _level, out=notes: out.append(message))
            optimizer = build_optimizer(params, config.train, device)
            scheduler = build_scheduler(optimizer, config.train, total)
            runner = StepRunner(model, tokenizer, optimizer, scheduler, None, params, config, device, torch.bfloat16,
                                SpeedSetup(offload=checkpointer))
            measured = [runner.step(rows, [pack], i, total) for i, pack in enumerate(packs)][warmup:]
            step_s = sum(m["step_time"] for m in measured) / len(measured)
            results.append(ModeResult(
                shape=shape, layers=info.layers, mode=mode, row_tokens=length, batch_tokens=batch_tokens,
                steps_per_s=1.0 / step_s, tokens_per_s=sum(m["tokens"] for m in measured) / len(measured) / step_s,
                peak_gib=max(m.get("mem_allocated", 0) for m in measured) / GIB,
                buffer_gib=max(m.get("buffer_bytes", 0) for m in measured) / GIB,
                host_gib=(checkpointer.host.total_bytes if checkpointer else 0) / GIB,
                copy_stall_ms=1000 * sum(m.get("copy_stall_s", 0.0) for m in measured) / len(measured),
                offload_gib=sum(m.get("offload_bytes", 0) for m in measured) / len(measured) / GIB,
                mode_in_effect=checkpointer.mode if checkpointer else "off", notes=notes))
            del runner, optimizer, scheduler, checkpointer
            revert_checkpointing(model)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return results


def format_table(results: list[ModeResult]) -> str:
    """A markdown table, with steps/s relative to `offload` and the peak-memory saving relative to `gpu`."""
    lines = ["| shape | rows | mode | steps/s | tokens/s | vs offload | peak GiB | saved vs gpu GiB | buffers GiB | "
             "pinned host GiB | copy stall ms/step |", "|" + "---|" * 11]
    for r in results:
        same = {x.mode: x for x in results if x.row_tokens == r.row_tokens}
        vs = f"{r.steps_per_s / same['offload'].steps_per_s:.3f}x" if "offload" in same else "-"
        saved = f"{same['gpu'].peak_gib - r.peak_gib:.2f}" if "gpu" in same else "-"
        mode = r.mode if r.mode_in_effect == r.mode else f"{r.mode} (ran as {r.mode_in_effect})"
        lines.append(f"| {r.shape} x{r.layers} | {r.row_tokens} | {mode} | {r.steps_per_s:.3f} | "
                     f"{r.tokens_per_s:,.0f} | {vs} | {r.peak_gib:.2f} | {saved} | {r.buffer_gib:.3f} | "
                     f"{r.host_gib:.2f} | {r.copy_stall_ms:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="dense-8b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the shape has")
    parser.add_argument("--rows", type=int, nargs="+", default=[8192, 16384], help="tokens per row")
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--modes", nargs="+", default=list(BENCH_MODES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", default="", help="also write the results to this file")
    args = parser.parse_args(argv)
    results = run_offload_bench(args.shape, args.layers, tuple(args.rows), args.batch_tokens, tuple(args.modes),
                                args.steps, args.warmup, device=args.device)
    print(format_table(results))
    print(f"note: {results[0].notes[0]}" if results else "no results")
    for r in results:
        for note in r.notes[1:]:
            print(f"note ({r.mode}, {r.row_tokens} tokens): {note}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

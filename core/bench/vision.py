"""Vision-language training speed on one GPU: Hone's Trainer against plain transformers + peft, same model, same
mixed data (text-only rows and rows with an image), same process. Prints a table and writes JSON.

    python tools/vision_bench.py [--layers 36] [--steps 8] [--batch-tokens 8192] [--out vision_bench.json]

The model has Qwen2.5-VL-3B's shape (random init, bf16): 36 text layers of width 2048, a 32-layer vision encoder
of width 1280. Images are 448 x 448 (256 image tokens each). Both paths train LoRA r16 on every linear layer of the
language model with AdamW; the reference pads each batch of rows, runs transformers' own loss (full logits) and
transformers' gradient checkpointing, which is how a plain transformers + peft script trains a VLM. Hone packs the
rows, uses its chunked loss and its own checkpoint choice. Tokens/s counts real (non-padding) tokens, from the
third step on; peak memory is torch's max_memory_allocated over the timed steps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

# Rows per kind in the generated data: enough for several batches of 8K tokens.
IMAGE_ROWS = 96
TEXT_ROWS = 96
IMAGE_SIDE = 448  # pixels: (448 / 14)^2 / 4 = 256 image tokens
WARMUP_STEPS = 2  # steps not timed (allocator warm-up, first kernel launches)
WORDS = (
    "the", "model", "reads", "a", "picture", "and", "a", "question", "then", "answers", "in", "a", "few", "words",
    "about", "colors", "shapes", "and", "places", "people", "like", "to", "train", "small", "models", "on", "their",
    "own", "data", "because", "it", "is", "fast", "and", "cheap",
)


def make_data(folder: Path, seed: int = 0) -> Path:
    """A JSONL of mixed rows (random sentences; noise images) under `folder`."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    rows = []
    for n in range(IMAGE_ROWS):
        path = folder / f"img{n}.png"
        Image.fromarray(noise.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)).save(path)
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": path.name},
                                         {"type": "text", "text": " ".join(rng.choices(WORDS, k=40))}]},
            {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(60, 200)))}]})
    for _ in range(TEXT_ROWS):
        question, answer = (" ".join(rng.choices(WORDS, k=rng.randint(50, n))) for n in (300, 400))
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    rng.shuffle(rows)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return data


def model_folder(folder: Path, layers: int, tokenizer_dir: Path | None = None) -> Path:
    """The model, with SmolLM2's tokenizer (from `tokenizer_dir`, else read from the bundled GGUF)."""
    import torch
    from transformers import AutoTokenizer

    from hone.core.resources import smollm2_gguf
    from hone.core.vision import tiny

    if tokenizer_dir is None:
        gguf = smollm2_gguf()
        tokenizer_dir = folder / "tokenizer"
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tokenizer_dir)
    tokenizer = tiny.vision_tokenizer("qwen2_5_vl", tokenizer_dir)
    model = tiny.build_vision_model("qwen2_5_vl", tokenizer, shape="real", layers=layers, dtype=torch.bfloat16)
    out = folder / "model"
    model.save_pretrained(out)
    tiny.build_processor("qwen2_5_vl", tokenizer, shape="real").save_pretrained(out)
    return out


def hone_run(model_dir: Path, data: Path, runs: Path, steps: int, batch_tokens: int) -> dict:
    import torch

    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    config = RunConfig().with_overrides([
        f"model.name_or_path={json.dumps(str(model_dir))}", f"data.train=[{json.dumps(str(data))}]",
        f"output.runs_dir={json.dumps(str(runs))}", "model.dtype=bfloat16", f"data.max_length={batch_tokens}",
        f"data.image_max_side={IMAGE_SIDE}", f"train.batch_tokens={batch_tokens}", f"train.max_steps={steps}",
        "train.lr=1e-4", "lora.r=16", "output.checkpoint_every=0"])
    torch.cuda.reset_peak_memory_stats()
    metrics, notices, failed = [], [], None
    for event in Trainer(config).run():
        if isinstance(event, events.StepMetrics):
            metrics.append(event)
        elif isinstance(event, events.RunStarted):
            notices.append(json.dumps(event.speed_paths))
        elif isinstance(event, events.Notice):
            notices.append(event.message)
        elif isinstance(event, events.RunFailed):
            failed = event.reason + "\n" + (event.details or "")[-3000:]
    if failed:
        raise RuntimeError(f"Hone's run failed: {failed}")
    timed = metrics[WARMUP_STEPS:]
    tokens = sum(m.tokens for m in timed)
    seconds = sum(m.step_time for m in timed)
    return {"tokens_per_s": tokens / seconds, "peak_gib": max(m.mem_allocated for m in timed) / 2**30,
            "losses": [round(m.loss, 4) for m in metrics], "tokens_per_step": tokens / len(timed), "notes": notices}


def reference_run(model_dir: Path, data: Path, steps: int, batch_tokens: int) -> dict:
    """Plain transformers + peft: padded batches, the model's own loss, transformers' gradient checkpointing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    from hone.core.config import DataConfig
    from hone.core.data import load_training_data, plan_packs
    from hone.core.models.load import load_tokenizer
    from hone.core.vision import family_for
    from hone.core.vision.collate import VisionCollator

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    processor = load_tokenizer(str(model_dir), model.config)
    cfg = DataConfig(train=[str(data)], max_length=batch_tokens, image_max_side=IMAGE_SIDE)
    rows = load_training_data(cfg, processor, cache_dir=data.parent / "cache").train
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=r".*language_model.*\.(q_proj|"
                                                  r"k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"))
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-4)
    # the same batches of rows as Hone's planner makes, padded (what a plain script does)
    padded = VisionCollator(family_for("qwen2_5_vl"), processor, model.config, image_max_side=IMAGE_SIDE,
                            packing=False, pad_id=processor.tokenizer.pad_token_id, dtype=torch.bfloat16)
    plan = plan_packs(rows.lengths, batch_tokens, seed=0, epoch=0)
    torch.cuda.reset_peak_memory_stats()
    times, tokens, losses = [], [], []
    for step in range(steps):
        batch = padded.collate([rows[i] for i in plan[step % len(plan)]]).to("cuda")
        inputs = batch.model_inputs()
        # transformers shifts labels itself: the label at t + 1 is what position t predicts
        labels = torch.where(torch.roll(batch.text.targets, 1, dims=1) != -100, batch.text.input_ids, -100)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = peft_model(**inputs, labels=labels)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        tokens.append(batch.num_tokens)
        losses.append(round(out.loss.item(), 4))
        if step == WARMUP_STEPS - 1:
            torch.cuda.reset_peak_memory_stats()
    peak = torch.cuda.max_memory_allocated() / 2**30
    timed = slice(WARMUP_STEPS, None)
    return {"tokens_per_s": sum(tokens[timed]) / sum(times[timed]), "peak_gib": peak, "losses": losses,
            "tokens_per_step": sum(tokens[timed]) / len(tokens[timed])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=36, help="text layers (Qwen2.5-VL-3B has 36)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per path (the first two untimed)")
    parser.add_argument("--batch-tokens", type=int, default=8192, help="tokens per micro-batch")
    parser.add_argument("--out", default="vision_bench.json", help="where the JSON results go")
    parser.add_argument("--tokenizer", type=Path, default=None, help="a folder with SmolLM2's tokenizer (default: "
                        "read from the bundled GGUF)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("vision_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hone-vision-bench-") as tmp:
        tmp = Path(tmp)
        data = make_data(tmp)
        model_dir = model_folder(tmp, args.layers, args.tokenizer)
        results = {"hone": hone_run(model_dir, data, tmp / "runs", args.steps, args.batch_tokens)}
        torch.cuda.empty_cache()
        results["transformers+peft"] = reference_run(model_dir, data, args.steps, args.batch_tokens)
    results["setup"] = {"layers": args.layers, "steps": args.steps, "batch_tokens": args.batch_tokens,
                        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    Path(args.out).write_text(json.dumps(results, indent=2))
    ref = results["transformers+peft"]
    print(f"Qwen2.5-VL-3B shape ({args.layers} text layers), LoRA r16, mixed rows (half with a 448 px image), "
          f"{args.batch_tokens} tokens per batch")
    print("| path | tokens/s | peak GiB | vs reference |\n|---|---|---|---|")
    for name in ("transformers+peft", "hone"):
        r = results[name]
        print(f"| {name} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} | "
              f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x speed, {r['peak_gib'] / ref['peak_gib']:.2f}x memory |")
    print("hone speed paths:", results["hone"]["notes"][:1])
    print("losses: hone", results["hone"]["losses"], "reference", ref["losses"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train real runs on a GPU capped to a smaller card's memory, with auto-fit on: do they fit, what did auto-fit
pick, how fast did they go.

    python3 tools/memory_capped_runs.py --shape dense-8b --qlora --cap 8GiB --steps 20 --json out.json

The model is a random-init model of a benchmark shape saved as a folder (the benchmark's QLoRA folder, with its
synthetic word-level tokenizer); the data are text rows of random token words, lengths log-uniform up to
--max-row tokens. The cap is `torch.cuda.set_per_process_memory_fraction` plus HONE_GPU_MEMORY for the planner.
The allocator runs as `hone` runs it (hone.core.machine.allocator); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False in
the environment measures the fixed-size segments instead.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def write_rows(path: Path, vocab: int, rows: int, max_row: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(rows):
            length = int(math.exp(rng.uniform(math.log(64), math.log(max_row - 8))))
            words = " ".join(f"<{rng.randrange(2, vocab)}>" for _ in range(length))
            f.write(json.dumps({"text": words}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="a benchmark scenario: dense-0.6b, dense-4b, dense-8b, ...")
    parser.add_argument("--cap", required=True, help="GPU memory to emulate, e.g. 8GiB")
    parser.add_argument("--qlora", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-row", type=int, default=4096, help="longest row in tokens (data.max_length)")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="what the run asks for before auto-fit")
    parser.add_argument("--model-cache", default=None, help="keep the saved model folder here")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    from hone.core.machine.allocator import prefer_expandable_segments

    prefer_expandable_segments()  # before torch touches CUDA
    import torch
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoTokenizer

    from hone.core import events
    from hone.core.bench.scenarios import get_scenario
    from hone.core.bench.weights import saved_model_folder, vocab_size
    from hone.core.config import RunConfig
    from hone.core.memory.run_plan import MEMORY_ENV, parse_size
    from hone.core.train.trainer import Trainer

    cap = parse_size(args.cap)
    total = torch.cuda.get_device_properties(0).total_memory
    scenario = get_scenario(args.shape)
    folder = saved_model_folder(scenario, None, seed=0, dtype=torch.bfloat16, device="cuda", cache_dir=args.model_cache)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.backend_tokenizer.pre_tokenizer = WhitespaceSplit()  # one token per "<id>" word
    tokenizer.save_pretrained(folder)
    torch.cuda.empty_cache()
    work = Path(tempfile.mkdtemp(prefix="hone-capped-"))
    data = work / "rows.jsonl"
    write_rows(data, vocab_size(scenario), rows=args.steps * 40, max_row=args.max_row, seed=0)
    config = RunConfig().with_overrides(
        [
            f'model.name_or_path="{folder.as_posix()}"',
            f'data.train=["{data.as_posix()}"]',
            'data.format="text"',
            f"data.max_length={args.max_row}",
            f"train.batch_tokens={max(args.batch_tokens, args.max_row)}",
            f"train.max_steps={args.steps}",
            f"lora.qlora={'true' if args.qlora else 'false'}",
            f'output.runs_dir="{(work / "runs").as_posix()}"',
            "output.checkpoint_every=0",
        ]
    )

    os.environ[MEMORY_ENV] = args.cap
    torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0), 0)
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    record: dict = {
        "shape": args.shape,
        "cap_gib": cap / 2**30,
        "qlora": args.qlora,
        "max_row": args.max_row,
        "asked_batch_tokens": config.train.batch_tokens,
        "notices": [],
        "steps": 0,
    }
    trainer = Trainer(config, device="cuda")
    for event in trainer.run():
        if isinstance(event, events.Notice) and event.topic == "memory":
            record["notices"].append(event.message)
            print("memory:", event.message, flush=True)
        elif isinstance(event, events.StepMetrics):
            record["steps"] = event.step
            record.setdefault("tokens_per_s", []).append(event.tokens_per_s)
        elif isinstance(event, events.RunFailed):
            record["failed"] = event.reason
            print("failed:", event.reason, flush=True)
        elif isinstance(event, events.RunFinished):
            record["finished"] = True
    record["batch_tokens"] = trainer.config.train.batch_tokens
    record["checkpoint"] = trainer.config.speed.checkpoint
    record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    record["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30  # what the cap binds
    record["allocator"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    speeds = sorted(record.get("tokens_per_s", [0.0])[2:] or record.get("tokens_per_s", [0.0]))
    record["median_tokens_per_s"] = speeds[len(speeds) // 2]
    record["seconds"] = time.monotonic() - started
    Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "tokens_per_s"}), flush=True)
    return 0 if record.get("finished") else 1


if __name__ == "__main__":
    sys.exit(main())

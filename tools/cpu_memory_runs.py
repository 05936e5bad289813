"""One training step of the bundled demo model on the CPU, its peak resident memory against the memory planner's
prediction: what calibrates the planner's CPU runs (hone.core.memory.estimate.CPU_RESIDENT_FACTOR).

    python3 tools/cpu_memory_runs.py --batch-tokens 2048 --checkpoint off --attention auto

Linux only (it reads and resets VmHWM, the process's peak resident set, through /proc). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def peak_resident() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--checkpoint", default="off", help="speed.checkpoint: off or gpu (recompute)")
    parser.add_argument("--attention", default="auto", help="speed.attention: auto (per row on a CPU) or sdpa")
    args = parser.parse_args()

    from hone.core import events
    from hone.core.demo.text import demo_config
    from hone.core.memory.estimate import GIB
    from hone.core.memory.run_plan import Memory, plan_run
    from hone.core.train.trainer import Trainer

    config = demo_config(runs_dir=tempfile.mkdtemp(prefix="hone-cpu-memory-")).with_overrides(
        [
            f"train.batch_tokens={args.batch_tokens}",
            f'speed.checkpoint="{args.checkpoint}"',
            f'speed.attention="{args.attention}"',
            "train.max_steps=1",
            "train.fit_memory=false",
            "data.eval=[]",
        ]
    )
    predicted = plan_run(config, Memory(float("inf"), "the CPU", gpu=False)).estimate
    record = {
        "batch_tokens": args.batch_tokens,
        "checkpoint": args.checkpoint,
        "attention": args.attention,
        "predicted_gib": round(predicted.peak_gib, 3),
    }
    started = time.monotonic()
    for event in Trainer(config, device="cpu").run():
        if isinstance(event, events.RunStarted):
            record["loaded_gib"] = round(peak_resident() / GIB, 3)
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # the peak from here on: the step's, not the loading's
        elif isinstance(event, events.StepMetrics):
            record["tokens"] = event.tokens
        elif isinstance(event, events.RunFailed):
            record["failed"] = event.reason
    record["measured_gib"] = round(peak_resident() / GIB, 3)
    record["error"] = round(predicted.peak_gib / record["measured_gib"] - 1, 3)
    record["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(record))


if __name__ == "__main__":
    main()

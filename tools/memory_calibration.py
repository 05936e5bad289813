"""The memory planner's calibration: measure the peak GPU memory of `hone bench` cases, and compare the planner's
prediction with each.

    python3 tools/memory_calibration.py measure --out DIR [--cases NAME,...]   on a GPU: one bench JSON per case
    python3 tools/memory_calibration.py compare DIR [--markdown]             anywhere: predicted vs measured

The cases are the benchmark scenarios with Hone's defaults (`all`), the long-row case, QLoRA, and single levers on
the 8B shape, each run with the `all` variant as its own baseline (no transformers + peft reference). The table in
docs/performance/memory-planner.md is `compare --markdown` of a `measure` run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

COMMON = ["--steps", "2", "--warmup", "1", "--micro", "off", "--no-sync-count"]
# Single memory levers switched off from Hone's defaults (runs of docs/performance/experiments.md)
LEVERS = [
    "all-ckpt-gpu=all,speed.checkpoint=gpu",
    "all-offload=all,speed.checkpoint=offload",
    "all-head-gpu=all,speed.host_lm_head=false",
    "all-embed-gpu=all,speed.host_embeddings=false",
    "all-untiled=all,speed.tiled_mlp=false",
]
# name -> (scenario, extra bench arguments, the listed runs to measure)
CASES: dict[str, tuple[str, list[str], str]] = {
    "dense-0.6b": ("dense-0.6b", [], "all"),
    "dense-0.6b-4k": ("dense-0.6b", ["--tokens", "4096"], "all"),
    "dense-4b": ("dense-4b", [], "all"),
    "dense-8b": ("dense-8b", [arg for lever in LEVERS for arg in ("--run", lever)], "all"),
    "dense-8b-qlora": ("dense-8b", ["--qlora"], "all"),
    "dense-8b-long": ("dense-8b", ["--tokens", "65536", "--seq-min", "16384", "--seq-max", "32768"], "all"),
    "dense-4b-qlora-4k": ("dense-4b", ["--qlora", "--tokens", "4096", "--seq-max", "4096"], "all"),
    "moe-qwen3": ("moe-qwen3", [], "all"),
    "moe-gptoss": ("moe-gptoss", [], "all"),
}


def measure(out: Path, names: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        scenario, extra, variants = CASES[name]
        command = [
            "hone",
            "bench",
            scenario,
            *extra,
            *COMMON,
            "--only",
            variants,
            "--baseline",
            "all",
            "--json",
            str(out / f"{name}.json"),
        ]
        start = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True)
        (out / f"{name}.log").write_text(done.stdout + done.stderr)
        print(f"{name}: exit {done.returncode} in {time.monotonic() - start:.0f} s", flush=True)
        failed += done.returncode != 0
    return 1 if failed else 0


def compare(folder: Path, markdown: bool) -> int:
    from hone.core.bench.memory_prediction import predict_bench_run

    rows = []
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        for run in report["runs"]:
            measured = run.get("peak_allocated_gib")
            if measured is None or run.get("kind", "hone") != "hone":
                continue  # the planner models Hone's runs, not a peer's
            predicted = predict_bench_run(report, run["name"])
            error = (predicted.peak_gib - measured) / measured
            rows.append((path.stem, run["name"], measured, predicted.peak_gib, error, predicted.summary()))
    if markdown:
        print("| case | run | measured GiB | predicted GiB | error | largest parts |")
        print("|---|---|---|---|---|---|")
        for case, run, measured, predicted, error, parts in rows:
            print(f"| {case} | {run} | {measured:.2f} | {predicted:.2f} | {error:+.1%} | {parts} |")
    else:
        for case, run, measured, predicted, error, parts in rows:
            print(f"{case:18} {run:14} measured {measured:7.2f}  predicted {predicted:7.2f}  {error:+6.1%}  {parts}")
    worst = max((abs(row[4]) for row in rows), default=0.0)
    print(f"{len(rows)} runs, largest error {worst:.1%}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    run = sub.add_parser("measure")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    check = sub.add_parser("compare")
    check.add_argument("folder", type=Path)
    check.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.step == "measure":
        return measure(args.out, [name.strip() for name in args.cases.split(",") if name.strip()])
    return compare(args.folder, args.markdown)


if __name__ == "__main__":
    sys.exit(main())

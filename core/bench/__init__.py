"""`hone bench`: speed and memory of Hone's speed paths next to plain transformers + peft, in one process.

    from hone.core.bench.run import BenchOptions, run_bench
    report = run_bench(BenchOptions(scenario="dense-0.6b", steps=5))
    for run in report.runs:
        print(run.name, run.tokens_per_s, run.speed_ratio, run.peak_allocated_gib, run.parity)

Modules: `scenarios` (what can be benchmarked), `batch` (the one token batch), `weights` (the same random-init
model for every run), `reference` (transformers + peft as a careful user runs it), `variants` (Hone's runs as
SpeedConfig settings) and `hone_runner` (the trainer's own setup and step), `measure` (timing, memory, MFU, syncs,
out-of-memory capture), `report` (ratios, table, environment, JSON), `micro` (attention alone), `peer_unsloth`
(Unsloth in a child process, untested), `run` (the whole benchmark).

This package imports nothing heavy itself: the Unsloth child process must import unsloth before transformers.
"""

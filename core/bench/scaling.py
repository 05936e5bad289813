"""`hone bench SCENARIO --gpus N`: how Hone's `all` run scales over N processes, one per GPU (gloo processes on a
machine without one), against one process of the same kind.

Each process trains its own packed batch of the scenario's tokens (seeded by its rank) with the data-parallel step
the trainer runs (`StepRunner` over `World`: the LoRA gradients summed over the processes before each update), so
a step of N processes trains N times the tokens of a step of one. Scaling efficiency = tokens/s of N processes ÷
(N × tokens/s of one). Both runs start with `torchrun` (`python -m torch.distributed.run`), the one-process run
too, so both pay for the exchange. Run as a module, this file is the worker each process runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hone.core.errors import ConfigError, HoneError


@dataclass(frozen=True)
class ScalingRun:
    """One launch: `processes` processes, each timing `steps` steps after `warmup`."""

    processes: int
    tokens_per_step: int  # over every process
    step_times_s: list[float]  # process 0's, timed steps only
    tokens_per_s: float  # over every process: tokens_per_step / median step time
    peak_gib_by_process: list[float]  # CUDA only; empty on the CPU
    first_loss: float
    speed_paths: dict

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s)


def efficiency(one: ScalingRun, many: ScalingRun) -> float:
    """Tokens/s of `many` ÷ (its processes × tokens/s of `one`)."""
    return many.tokens_per_s / (many.processes * one.tokens_per_s)


def run_scaling(spec: dict, processes: int, *, timeout_s: float = 3600) -> list[ScalingRun]:
    """Launch the worker on one process, then on `processes`, and return both runs.

    `spec`: scenario, tokens, layers, lora_r, lora_experts, seed, seq_min, seq_max, warmup, steps, dtype and
    parallel ("ddp" or "fsdp": the frozen weights split across the processes, as `train.parallel = fsdp`).

    Raises:
        ConfigError: fewer than two processes, or more than the GPUs this machine has.
        HoneError: a launch failed (its last messages in the text).
    """
    check_processes(processes)
    return [_launch(spec, n, timeout_s) for n in (1, processes)]


def check_processes(processes: int) -> None:
    """Refuse a process count scaling cannot be measured with on this machine (ConfigError)."""
    import torch

    if processes < 2:
        raise ConfigError(
            f"--gpus {processes}: scaling is measured from 2 processes on",
            "give --gpus 2 or more, or leave it out for the one-GPU benchmark",
        )
    if torch.cuda.is_available() and processes > torch.cuda.device_count():
        raise ConfigError(
            f"--gpus {processes} asks for {processes} GPUs, and this machine has {torch.cuda.device_count()}",
            f"use --gpus {torch.cuda.device_count()} or fewer",
        )


def _launch(spec: dict, processes: int, timeout_s: float) -> ScalingRun:
    with tempfile.TemporaryDirectory(prefix="hone-scaling-") as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(processes),
            "-m",
            "hone.core.bench.scaling",
            str(spec_path),
            str(out_path),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HoneError(
                f"the {processes}-process run took over {timeout_s:.0f} s", "measure fewer steps, or a smaller scenario"
            ) from None
        if done.returncode != 0 or not out_path.is_file():
            raise HoneError(
                f"the {processes}-process run failed (exit code {done.returncode}): {failure_text(done.stderr)}",
                f"the one-GPU benchmark (`hone bench {spec['scenario']}`) shows whether the scenario runs "
                "on this machine at all",
            )
        return ScalingRun(**json.loads(out_path.read_text(encoding="utf-8")))


_LAUNCHER_TRACEBACK = "Traceback (most recent call last)"
_ROOT_CAUSE = "Root Cause"


def failure_text(stderr: str, keep: int = 1200) -> str:
    """What a failed torchrun launch said, shortened: the end of what its processes printed (a rank's own error, a
    C++ abort's message) and torchrun's root-cause lines. torchrun's own traceback and summary, which come last and
    are long, would otherwise push the rank's message out of a plain tail."""
    text = stderr.strip()
    start = text.rfind(_LAUNCHER_TRACEBACK)
    cause = text.find(_ROOT_CAUSE, max(start, 0))
    if start < 0 or cause < 0:
        return text[-keep:]
    ranks = text[:start].strip()[-keep:]
    return (ranks + "\n...\n" if ranks else "") + text[cause:][:keep]


def _worker(spec: dict, out: Path) -> None:
    """One process of a launch: train its batch with the data-parallel step, process 0 writes the result."""
    import torch

    from hone.core.bench.batch import make_batch
    from hone.core.bench.hone_runner import HoneRunner
    from hone.core.bench.run import resolve_dtype
    from hone.core.bench.scenarios import get_scenario
    from hone.core.bench.variants import VARIANTS
    from hone.core.bench.weights import vocab_size
    from hone.core.train import distributed

    world = distributed.from_environment()
    device = distributed.join(world)
    try:
        scenario = get_scenario(spec["scenario"])
        dtype = resolve_dtype(spec["dtype"], device)
        batch = make_batch(
            spec["tokens"] or scenario.tokens,
            vocab_size(scenario),
            seed=spec["seed"] + world.rank,
            min_len=spec["seq_min"] or scenario.min_len,
            max_len=spec["seq_max"] or scenario.max_len,
        )
        variant = next(v for v in VARIANTS if v.name == "all")
        runner = HoneRunner(
            variant,
            scenario,
            spec["layers"],
            batch,
            lora_r=spec["lora_r"],
            seed=spec["seed"],
            dtype=dtype,
            device=device,
            lora_experts=spec["lora_experts"],
            world=world,
        )
        runner.setup()
        if spec.get("parallel") == "fsdp":  # as the trainer does with train.parallel = fsdp
            from hone.core.train import sharding

            runner.setup_state.choices["parallel"] = sharding.shard_frozen_weights(runner.model, world, device)
            runner.runner.sharded = True
        cuda = device.startswith("cuda")
        first_loss, times = None, []
        for index in range(spec["warmup"] + spec["steps"]):
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            outcome = runner.step()  # its loss is read on the host: the step has ended on every process
            elapsed = time.perf_counter() - started
            first_loss = outcome.loss if first_loss is None else first_loss
            if index >= spec["warmup"]:
                times.append(elapsed)
        tokens = distributed.sum_values([float(batch.tokens)], world)[0]
        peaks = distributed.gather_counts(torch.cuda.max_memory_allocated() if cuda else 0, world)
        if world.main:
            run = ScalingRun(
                processes=world.size,
                tokens_per_step=int(tokens),
                step_times_s=times,
                tokens_per_s=tokens / statistics.median(times),
                peak_gib_by_process=[p / 2**30 for p in peaks] if cuda else [],
                first_loss=float(first_loss),
                speed_paths=dict(runner.setup_state.choices),
            )
            out.write_text(json.dumps(asdict(run)), encoding="utf-8")
        runner.teardown()
        distributed.finish_together(world)
    finally:
        distributed.leave()


if __name__ == "__main__":
    _worker(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")), Path(sys.argv[2]))
    # The result is written and the process group is gone: end here, without the interpreter's shutdown. There,
    # C++ threads that torch.distributed's backends left behind can be destroyed while still joinable, which aborts
    # the process ("terminate called without an active exception") after a run that succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

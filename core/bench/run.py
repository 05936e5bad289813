"""One text-scenario benchmark: build the batch, find the MFU roof, run every selected run, compare, record.

    report = run_bench(BenchOptions(scenario="dense-0.6b"))
    report.runs          # RunResult per run, ratios against the baseline filled in; report.to_dict() for --json

Runs happen in this process one after the other, each on a freshly built model and an emptied GPU cache: the
transformers + peft reference first (and for MoE models the eager-experts reference), then the Hone variants,
then an optional peer in its own process. Vision scenarios run through `hone.core.bench.vision` instead.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from hone.core.bench import attention
from hone.core.bench.batch import TokenBatch, make_batch
from hone.core.bench.hone_runner import HoneRunner
from hone.core.bench.measure import (
    MfuRoof,
    RunResult,
    Settings,
    cap_fraction,
    capped_memory,
    free_memory,
    measure_run,
    mfu_roof,
)
from hone.core.bench.report import PARITY_TOLERANCE, compare, environment
from hone.core.bench.scenarios import Scenario, check_sizes, get_scenario
from hone.core.bench.transformers_peft import ReferenceRunner
from hone.core.bench.variants import VARIANTS, applies, bench_variants, speed_settings, train_settings, unavailable
from hone.core.bench.weights import architecture_facts, remove_folder, saved_model_folder, vocab_size
from hone.core.errors import ConfigError

# References every run is also compared with when they ran (MoE: the eager-experts reference, a target of its own).
SECONDARY_BASELINES = ("reference-eager",)
FLOPS_CONVENTION = (
    "6 x N x tokens per step; N = parameters one token passes through (all, embedding and LM "
    "head included, LoRA included, routed experts scaled by top-k / experts); attention scores "
    "and checkpoint recompute not counted; against the matmul rate measured on the GPU at start "
    "or the peak given with --peak-flops (mfu_roof says which; a CPU has none unless given)"
)


@dataclass
class BenchOptions:
    """What `hone bench` was asked to do (CLI flags, one to one)."""

    scenario: str
    tokens: int | None = None
    layers: int | None = None
    lora_r: int = 16
    lora_experts: bool = True  # --lora-experts: LoRA on MoE expert weights too, in Hone and the reference
    qlora: bool = False
    steps: int = 5
    warmup: int = 2
    seed: int = 0
    seq_min: int | None = None
    seq_max: int | None = None
    only: list[str] | None = None
    baseline: str = "reference"
    peer: str | None = None
    device: str | None = None
    dtype: str = "auto"
    micro: str = "auto"  # attention-alone micro-benchmark: auto (on CUDA) | on | off
    model_cache: str | None = None
    count_syncs: bool = True
    profile_top: int = 0  # --profile: one extra step per run under torch.profiler, this many rows per table
    memory_trace_top: int = 0  # --memory-trace: one extra step per run with the allocator history, sites shown
    host_profile_top: int = 0  # --host-profile: one extra step per run under cProfile, functions shown
    peak_flops: float | None = None  # --peak-flops: the FLOP/s MFU is taken against, instead of a measured rate
    memory_cap: float | None = None  # --memory-cap: bytes every run (the peer's too) may allocate, as on a smaller GPU
    extra_runs: list[str] | None = None  # --run: runs of the user's own, NAME=RUN,SETTING=VALUE,... each


@dataclass(frozen=True)
class PlannedRun:
    """A run to measure, or one recorded as skipped without building anything."""

    name: str
    kind: str
    description: str
    overrides: dict = field(default_factory=dict)
    make: Callable | None = None  # () -> Runner
    skip_reason: str = ""


@dataclass
class BenchReport:
    options: BenchOptions
    scenario: Scenario
    batch: dict
    device: str
    dtype: str
    environment: dict
    mfu_roof: MfuRoof
    architecture: dict
    runs: list[RunResult]
    attention_micro: dict | None
    elapsed_s: float = 0.0

    @property
    def matmul_tflops(self) -> float | None:
        """The matmul rate measured on the GPU at start (TFLOP/s); None when none was measured."""
        return self.mfu_roof.flops / 1e12 if self.mfu_roof.source == "measured" else None

    def run(self, name: str) -> RunResult:
        return next(r for r in self.runs if r.name == name)

    def to_dict(self) -> dict:
        loss_tol, grad_tol = PARITY_TOLERANCE.get(self.dtype, PARITY_TOLERANCE["bfloat16"])
        return {
            "schema": 1,
            "scenario": asdict(self.scenario),
            "options": asdict(self.options),
            "device": self.device,
            "dtype": self.dtype,
            "batch": self.batch,
            "architecture": self.architecture,
            "environment": self.environment,
            "matmul_tflops": self.matmul_tflops,
            "mfu_roof": self.mfu_roof.to_dict(),
            "flops_convention": FLOPS_CONVENTION,
            "baseline": self.options.baseline,
            "parity_tolerance": {"loss_rel": loss_tol, "grad_norm_rel": grad_tol},
            "runs": [r.to_dict() for r in self.runs],
            "attention_micro": self.attention_micro,
            "elapsed_s": self.elapsed_s,
        }


def resolve_device(requested: str | None) -> str:
    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: no CUDA GPU is available", "leave --device out to use the CPU")
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _selected(name: str, only: list[str] | None, baseline: str) -> bool:
    return only is None or name == baseline or any(fnmatch.fnmatchcase(name, pattern) for pattern in only)


def _qlora_blocker(device: str) -> str | None:
    """Why no QLoRA run can happen here, or None."""
    if not device.startswith("cuda"):
        return "QLoRA needs a CUDA GPU"
    if importlib.util.find_spec("bitsandbytes") is None:
        return "QLoRA needs the bitsandbytes package, which is not installed"
    return None


def plan_runs(
    options: BenchOptions,
    scenario: Scenario,
    facts: dict,
    batch: TokenBatch,
    device: str,
    dtype: torch.dtype,
    model_folder=None,
) -> list[PlannedRun]:
    """Every run this benchmark makes, in order: the references, the listed Hone runs, the --run runs. --only picks
    among them (the baseline and the --run runs always stay); with --run and no --only, none of the listed ones.

    Raises:
        ConfigError: a --run that `custom_variant` refuses, a --baseline or an --only that names no run.
    """
    variants = bench_variants(options.extra_runs)
    own = {v.name for v in variants[len(VARIANTS) :]}  # the --run runs: always made, or recorded as skipped
    is_moe = bool(facts["experts"])
    common = dict(
        lora_r=options.lora_r,
        seed=options.seed,
        dtype=dtype,
        device=device,
        qlora=options.qlora,
        model_folder=model_folder,
        lora_experts=options.lora_experts,
    )
    references = [
        (
            "reference",
            "grouped_mm" if is_moe else None,
            "transformers + peft, LoRA on all linear layers"
            + (" and experts" if is_moe and options.lora_experts else "")
            + ", HF gradient checkpointing, packed row with position ids, SDPA"
            + (", experts grouped_mm" if is_moe else ""),
        )
    ]
    if is_moe:
        references.append(("reference-eager", "eager", "the same with experts_implementation=eager"))
    planned = [
        PlannedRun(
            name,
            "reference",
            text,
            make=lambda n=name, e=experts: ReferenceRunner(
                n, scenario, options.layers, batch, experts_implementation=e, **common
            ),
        )
        for name, experts, text in references
    ]
    for variant in variants:
        if applies(variant, is_moe):
            reason = unavailable(variant, device)
        elif variant.name in own:
            reason = "needs an MoE model" if "moe" in variant.needs else "needs a dense model"
        else:
            continue
        overrides = {**speed_settings(variant), **train_settings(variant)}
        planned.append(
            PlannedRun(
                variant.name,
                "hone",
                variant.description,
                overrides=overrides,
                skip_reason=reason or "",
                make=None if reason else (lambda v=variant: HoneRunner(v, scenario, options.layers, batch, **common)),
            )
        )
    qlora_blocker = _qlora_blocker(device) if options.qlora else None
    if qlora_blocker:
        planned = [PlannedRun(p.name, p.kind, p.description, p.overrides, None, qlora_blocker) for p in planned]
    names = [p.name for p in planned]
    if options.baseline not in names:
        raise ConfigError(
            f"--baseline {options.baseline!r} is not a run of this benchmark", f"runs are: {', '.join(names)}"
        )
    for pattern in options.only or []:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names) and not (
            options.peer and fnmatch.fnmatchcase(options.peer, pattern)
        ):
            raise ConfigError(f"--only {pattern!r} matches no run of this benchmark", f"runs are: {', '.join(names)}")
    only = [] if own and options.only is None else options.only  # --run alone: its runs against the baseline
    return [p for p in planned if p.name in own or _selected(p.name, only, options.baseline)]


def _peer_spec(
    options: BenchOptions,
    scenario: Scenario,
    batch: TokenBatch,
    device: str,
    dtype: torch.dtype,
    peak_flops: float | None,
) -> dict:
    return {
        "scenario": scenario.name,
        "layers": options.layers if options.layers is not None else scenario.layers,
        "tokens": batch.tokens,
        "min_len": batch.min_len,
        "max_len": batch.max_len,
        "seed": options.seed,
        "lora_r": options.lora_r,
        "lora_experts": options.lora_experts,
        "qlora": options.qlora,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "warmup": options.warmup,
        "steps": options.steps,
        "peak_flops": peak_flops,
        "model_cache": options.model_cache,
        "memory_cap": options.memory_cap,
    }


def _check_text_options(options: BenchOptions, scenario: Scenario) -> None:
    """Refuse, before anything is built, options a text-scenario benchmark cannot run with.

    Raises:
        ConfigError: a vision scenario, a bad size, a peak rate that is not a positive number, an unknown peer.
    """
    if scenario.kind != "text":
        raise ConfigError(
            f"{scenario.name} is a {scenario.kind} scenario",
            "run it with hone.core.bench.vision.run_vision_bench (`hone bench` picks it)",
        )
    check_sizes(options.steps, options.warmup, options.lora_r, options.layers)
    if options.peak_flops is not None and not (math.isfinite(options.peak_flops) and options.peak_flops > 0):
        raise ConfigError(
            f"--peak-flops {options.peak_flops:g}: a peak rate is a positive number of FLOP/s",
            "give the device's peak matmul rate, e.g. --peak-flops 2e12 for 2 TFLOP/s",
        )
    if options.peer not in (None, "unsloth"):
        raise ConfigError(f"--peer {options.peer!r} is not a known peer", "the peer Hone knows is: unsloth")


def run_bench(
    options: BenchOptions,
    *,
    on_result: Callable[[RunResult], None] | None = None,
    on_start: Callable[[str], None] | None = None,
) -> BenchReport:
    """Run the text-scenario benchmark `options` describes (vision scenarios: `hone.core.bench.vision`).

    Args:
        options: the command's options.
        on_result: called with each RunResult as soon as it is measured (for progress output).
        on_start: called with each run's name before it starts.

    Raises:
        ConfigError: an unknown or a vision scenario, a bad size, a --run that means no run, an --only or
            --baseline that names no run.
    """
    started = time.perf_counter()
    scenario = get_scenario(options.scenario)
    _check_text_options(options, scenario)
    device = resolve_device(options.device)
    if options.memory_cap is not None:
        cap_fraction(device, options.memory_cap)  # a cap this device cannot take fails before anything is built
    dtype = resolve_dtype(options.dtype, device)
    facts = architecture_facts(scenario, options.layers)
    batch = make_batch(
        options.tokens or scenario.tokens,
        vocab_size(scenario),
        seed=options.seed,
        min_len=options.seq_min or scenario.min_len,
        max_len=options.seq_max or scenario.max_len,
    )
    model_folder = None
    planned = plan_runs(options, scenario, facts, batch, device, dtype)

    free_memory(device)
    roof = mfu_roof(device, dtype, options.peak_flops)
    free_memory(device)  # the probe's cached blocks must not count as the first run's reserved memory
    settings = Settings(
        warmup=options.warmup,
        steps=options.steps,
        device=device,
        tokens=batch.tokens,
        peak_flops=roof.flops,
        count_syncs=options.count_syncs,
        profile_top=options.profile_top,
        memory_trace_top=options.memory_trace_top,
        host_profile_top=options.host_profile_top,
    )
    runs: list[RunResult] = []
    try:
        if options.qlora and device.startswith("cuda") and any(p.make for p in planned):
            model_folder = saved_model_folder(
                scenario, options.layers, seed=options.seed, dtype=dtype, device=device, cache_dir=options.model_cache
            )
            planned = plan_runs(options, scenario, facts, batch, device, dtype, model_folder)
            free_memory(device)
        for plan in planned:
            if on_start:
                on_start(plan.name)
            if plan.make is None:
                result = RunResult(
                    name=plan.name,
                    kind=plan.kind,
                    description=plan.description,
                    overrides=plan.overrides,
                    status="skipped",
                    reason=plan.skip_reason,
                    tokens=batch.tokens,
                )
            else:
                with capped_memory(device, options.memory_cap):
                    result = measure_run(plan.make(), settings, description=plan.description, overrides=plan.overrides)
            runs.append(result)
            if on_result:
                on_result(result)
    finally:
        if options.model_cache is None:
            remove_folder(model_folder)
    if options.peer == "unsloth":
        from hone.core.bench.peer_unsloth import run_unsloth_peer

        if on_start:
            on_start("unsloth")
        free_memory(device)
        result = run_unsloth_peer(_peer_spec(options, scenario, batch, device, dtype, roof.flops))
        runs.append(result)
        if on_result:
            on_result(result)

    dtype_name = str(dtype).removeprefix("torch.")
    compare(runs, options.baseline, dtype_name, also=SECONDARY_BASELINES)
    micro = None
    if options.micro == "on" or (options.micro == "auto" and device.startswith("cuda")):
        if on_start:
            on_start("attention alone")
        micro = attention.run_on_batch(batch, facts, device=device, dtype=dtype)
    return BenchReport(
        options=options,
        scenario=scenario,
        batch=batch.describe(),
        device=device,
        dtype=dtype_name,
        environment=environment(device),
        mfu_roof=roof,
        architecture=facts,
        runs=runs,
        attention_micro=micro,
        elapsed_s=time.perf_counter() - started,
    )

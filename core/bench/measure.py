"""Measuring one run: timed steps, peak memory, MFU, first-step loss, host syncs, and out-of-memory capture.

A run is anything with the `Runner` shape (the transformers + peft reference, a Hone variant, the peer, a test
double). `measure_run` sets it up, runs warm-up steps (the first one's loss and gradient norm are the parity
numbers), times steps (synchronized before and after each; the median counts), counts host syncs in one forward
+ backward and tears it down. A failure is recorded in the run's `RunResult` ("oom", "skipped" or "failed"),
never raised: the caller goes on with the next run.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

from hone.core.errors import ConfigError

GIB = 2**30
# Text of the warning CUDA's sync debug mode raises on every synchronizing call (c10 warn_or_error_on_sync).
_SYNC_WARNING = "synchronizing CUDA operation"


class SkipRun(Exception):
    """A run that cannot happen in this build or on this device; the message says why."""


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step reports: mean loss over trained tokens, gradient norm before clipping, the step's own
    count of its peak allocated bytes where it keeps one (None: the allocator's peak says it), and the bytes of layer
    inputs it offloaded to host memory where it knows them."""

    loss: float
    grad_norm: float
    peak_bytes: int | None = None
    offload_bytes: int | None = None  # layer inputs the step moved to host memory (Hone's offloaded checkpoints)


def loss_scaler(dtype: torch.dtype, device: str):
    """The loss scaler a float16 run on a GPU trains with, as transformers' Trainer does with `fp16=True` (and Hone's
    trainer always): without it most of a float16 step's gradients round to zero. None for other runs."""
    return torch.amp.GradScaler("cuda") if dtype == torch.float16 and str(device).startswith("cuda") else None


def optimizer_step(loss: torch.Tensor, params, optimizer, scaler, max_norm: float) -> float:
    """Back-propagate `loss` (scaled when `scaler` is given), clip the gradients (unscaled first) and step; the
    gradient norm before clipping."""
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


class Runner(Protocol):
    """`setup()` builds model and optimizer, `step()` runs one optimizer step and reports its loss,
    `forward_backward()` runs the step's forward and backward only (for counting syncs), `teardown()` drops
    everything."""

    name: str
    kind: str  # "reference" | "hone" | "peer"

    def setup(self) -> None: ...

    def step(self) -> StepOutcome: ...

    def forward_backward(self) -> None: ...

    def teardown(self) -> None: ...

    def describe(self) -> dict:
        """speed_paths (dict), trainable_params, active_params once set up."""
        ...


@dataclass
class RunResult:
    """Everything measured about one run; `to_dict` is its JSON form."""

    name: str
    kind: str
    description: str = ""
    status: str = "ok"  # ok | oom | skipped | failed
    reason: str = ""
    details: str = ""  # traceback of a failure
    overrides: dict = field(default_factory=dict)
    speed_paths: dict = field(default_factory=dict)
    tokens: int = 0
    warmup_steps: int = 0
    steps: int = 0
    step_times_s: list[float] = field(default_factory=list)
    median_step_s: float | None = None
    tokens_per_s: float | None = None
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    warmup_peak_allocated_gib: float | None = None
    memory_before_gib: float | None = None
    offload_gib: float | None = None  # layer inputs the last timed step held in host memory (None: not reported)
    kept_layers: int | None = None  # Hone's runs: decoder layers that kept their activations (not recomputed)
    spare: list[str] = field(default_factory=list)  # what all-spare set from the GPU's free memory (config overrides)
    mfu: float | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    first_grad_norm: float | None = None
    syncs_fwd_bwd: int | None = None
    setup_s: float | None = None
    first_step_s: float | None = None
    trainable_params: int | None = None
    active_params: int | None = None
    # one extra step each, under a tool (hone.core.bench.diagnostics): --profile, --memory-trace, --host-profile
    profile: dict | None = None
    memory_trace: dict | None = None
    host_profile: dict | None = None
    # Filled in against the baseline run by report.compare.
    speed_ratio: float | None = None
    memory_ratio: float | None = None
    loss_diff: float | None = None
    loss_rel_diff: float | None = None
    grad_norm_rel_diff: float | None = None
    parity: bool | None = None
    parity_reason: str = ""  # why parity is no although the losses agree (another trainable set)
    # tokens/s ratio against other reference runs that ran (e.g. {"reference-eager": 9.1}).
    speed_ratios: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Settings:
    """How every run is measured."""

    warmup: int
    steps: int
    device: str
    tokens: int
    peak_flops: float | None  # the FLOP/s MFU is taken against (`mfu_roof`); None: no MFU
    count_syncs: bool = True
    profile_top: int = 0  # > 0: profile one extra step and keep this many rows per table
    memory_trace_top: int = 0  # > 0: trace one extra step's allocations, this many sites at the peak
    host_profile_top: int = 0  # > 0: one extra step under cProfile, this many functions


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, host MemoryError, or a kernel's plain RuntimeError saying so."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def free_memory(device: str) -> None:
    """Collect garbage and hand cached blocks back, so the next run starts from an empty GPU."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def cap_fraction(device: str, cap_bytes: float) -> float:
    """The share of `device`'s memory that `cap_bytes` is, for `torch.cuda.set_per_process_memory_fraction`.

    Raises:
        ConfigError: not a CUDA device, or a cap larger than the GPU.
    """
    if torch.device(device).type != "cuda":
        raise ConfigError(f"--memory-cap works on a CUDA GPU, not on {device}", "leave --memory-cap out here")
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    if not 0 < cap_bytes <= total:
        raise ConfigError(
            f"--memory-cap {cap_bytes / GIB:.1f} GiB: this GPU has {total / GIB:.1f} GiB",
            "give a cap above 0 and at most the GPU's memory, e.g. --memory-cap 8GiB",
        )
    return cap_bytes / total


@contextmanager
def capped_memory(device: str, cap_bytes: float | None) -> Iterator[None]:
    """Let this process allocate at most `cap_bytes` on `device` inside the block, as on a smaller card (the cap
    binds the allocator's reserved blocks too, as a card's size does); no cap when None."""
    if cap_bytes is None:
        yield
        return
    fraction, index = cap_fraction(device, cap_bytes), torch.device(device).index
    before = torch.cuda.get_per_process_memory_fraction(index)
    free_memory(device)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(before, index)


def allocated_gib(device: str) -> float | None:
    return torch.cuda.memory_allocated() / GIB if torch.device(device).type == "cuda" else None


def count_syncs(fn, device: str) -> int | None:
    """Host<->device synchronizations while `fn()` runs, from CUDA's sync debug mode; None off CUDA.

    Every synchronizing call torch makes (a `.item()`, `.tolist()`, `nonzero`, a blocking copy, a stream or
    device synchronize) raises a warning in "warn" mode; warnings from the backward pass's worker threads are
    replayed on the calling thread. Syncs made outside torch's own CUDA calls (e.g. inside a third-party
    extension) are not seen.
    """
    if torch.device(device).type != "cuda":
        return None
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    return sum(1 for w in caught if _SYNC_WARNING in str(w.message))


@dataclass(frozen=True)
class MfuRoof:
    """The FLOP/s MFU is taken against, where it came from, and one line saying so (or why there is no MFU)."""

    flops: float | None  # None: no MFU in this benchmark
    source: str  # "measured" (the matmul rate on this GPU at start) | "given" (--peak-flops) | "none"
    note: str

    def to_dict(self) -> dict:
        return {"tflops": None if self.flops is None else self.flops / 1e12, "source": self.source, "note": self.note}


def mfu_roof(device: str, dtype: torch.dtype, given: float | None = None) -> MfuRoof:
    """What MFU is measured against on `device`: the peak the user gave, else the matmul rate measured on a GPU.

    A CPU gets no MFU unless a peak is given: its matmul rate moves with the load and the threads other processes
    take, so a rate probed at start is no roof (on a loaded machine a small probe read low enough that runs showed
    an "MFU" above 100 %).
    """
    name = str(dtype).removeprefix("torch.")
    if given is not None:
        return MfuRoof(given, "given", f"MFU against the given peak of {given / 1e12:.4g} TFLOP/s (--peak-flops)")
    if torch.device(device).type != "cuda":
        return MfuRoof(
            None,
            "none",
            "no MFU on a CPU: its matmul rate moves with the machine's load, so a rate "
            "measured at start is no roof; give the peak with --peak-flops to get one",
        )
    rate = matmul_rate(device, dtype)
    return MfuRoof(
        rate,
        "measured",
        f"MFU against the {name} matmul rate measured on this GPU at start ({rate / 1e12:.4g} TFLOP/s)",
    )


def matmul_rate(device: str, dtype: torch.dtype) -> float:
    """Best measured FLOP/s of a square matmul in `dtype` on `device`: the roof MFU is taken against."""
    cuda = torch.device(device).type == "cuda"
    # 8192^3 keeps an H200 busy for ~1.4 ms per product, long enough to reach its roof; a CPU gets 512^3.
    n = 8192 if cuda else 512
    repeats = 20 if cuda else 3
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(3):  # the first round warms up the library's kernel choice
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * n**3 / best


def _reset_peak(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peaks(device: str, outcome: StepOutcome | None = None) -> tuple[float | None, float | None]:
    """The step's allocated and reserved peaks; the allocated one at least what the step itself reports (a
    replayed CUDA graph's memory is its recording's, which the allocator's peak does not see again)."""
    if torch.device(device).type != "cuda":
        return None, None
    allocated = max(torch.cuda.max_memory_allocated(), (outcome and outcome.peak_bytes) or 0)
    return allocated / GIB, torch.cuda.max_memory_reserved() / GIB


def _timed_step(runner: Runner, device: str) -> tuple[StepOutcome, float, float | None, float | None]:
    _reset_peak(device)
    synchronize(device)
    start = time.perf_counter()
    outcome = runner.step()
    synchronize(device)
    elapsed = time.perf_counter() - start
    return (outcome, elapsed, *_peaks(device, outcome))


def _drive(runner: Runner, settings: Settings, result: RunResult) -> None:
    started = time.perf_counter()
    runner.setup()
    result.setup_s = time.perf_counter() - started
    described = runner.describe()
    result.speed_paths = dict(described.get("speed_paths", {}))
    result.trainable_params = described.get("trainable_params")
    result.active_params = described.get("active_params")
    result.kept_layers = described.get("kept_layers")
    result.spare = list(described.get("spare", []))

    warm_peaks = []
    for index in range(settings.warmup):
        outcome, elapsed, peak, _ = _timed_step(runner, settings.device)
        if index == 0:
            result.first_loss, result.first_grad_norm, result.first_step_s = outcome.loss, outcome.grad_norm, elapsed
        warm_peaks.append(peak)
    peaks, reserved = [], []
    for _ in range(settings.steps):
        outcome, elapsed, peak, peak_reserved = _timed_step(runner, settings.device)
        if result.first_loss is None:
            result.first_loss, result.first_grad_norm, result.first_step_s = outcome.loss, outcome.grad_norm, elapsed
        result.step_times_s.append(elapsed)
        result.last_loss = outcome.loss
        if outcome.offload_bytes is not None:
            result.offload_gib = outcome.offload_bytes / GIB
        peaks.append(peak)
        reserved.append(peak_reserved)

    result.median_step_s = statistics.median(result.step_times_s)
    result.tokens_per_s = settings.tokens / result.median_step_s
    if peaks and peaks[0] is not None:
        result.peak_allocated_gib, result.peak_reserved_gib = max(peaks), max(reserved)
    if warm_peaks and warm_peaks[0] is not None:
        result.warmup_peak_allocated_gib = max(warm_peaks)
    if settings.peak_flops and result.active_params:
        result.mfu = 6 * result.active_params * settings.tokens / result.median_step_s / settings.peak_flops
    if settings.count_syncs:
        result.syncs_fwd_bwd = count_syncs(runner.forward_backward, settings.device)
    if settings.profile_top > 0:
        result.profile = _profile(runner, settings)
    if settings.memory_trace_top > 0:
        result.memory_trace = _memory_trace(runner, settings)
    if settings.host_profile_top > 0:
        from hone.core.bench.diagnostics.host_profile import host_profile_step

        result.host_profile = _extra_step(
            lambda: host_profile_step(runner, settings.device, top=settings.host_profile_top), settings.device
        )


def _profile(runner: Runner, settings: Settings) -> dict:
    """One more step under the profiler, after the timed ones (their numbers stay unprofiled)."""
    from hone.core.bench.diagnostics.profile import profile_step

    return _extra_step(lambda: profile_step(runner, settings.device, top=settings.profile_top), settings.device)


def _memory_trace(runner: Runner, settings: Settings) -> dict:
    """One more step with the allocator recording, after the timed ones."""
    from hone.core.bench.diagnostics.memory_trace import trace_step

    return _extra_step(lambda: trace_step(runner, settings.device, top=settings.memory_trace_top), settings.device)


def _extra_step(measure, device: str) -> dict:
    """A diagnostic step's summary; one that fails (out of memory with the profiler's buffers, say) is recorded in
    the summary, not as the run's failure."""
    try:
        return measure()
    except Exception as e:
        if is_out_of_memory(e):
            free_memory(device)
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def record_failure(result: RunResult, error: Exception, device: str) -> None:
    """Record why a run stopped: "skipped" (`SkipRun`, a speed path's ConfigError), "oom" (with the peaks reached),
    or "failed" with the traceback."""
    if isinstance(error, SkipRun):
        result.status, result.reason = "skipped", str(error)
    elif isinstance(error, ConfigError):  # a speed path said it cannot run here
        result.status, result.reason = "skipped", error.message
    elif is_out_of_memory(error):
        result.status = "oom"
        result.peak_allocated_gib, result.peak_reserved_gib = _peaks(device)
        text = str(error).strip()
        result.reason = text.splitlines()[0][:300] if text else type(error).__name__
    else:
        result.status, result.reason = "failed", f"{type(error).__name__}: {error}"[:500]
        result.details = "".join(traceback.format_exception(error))


def measure_run(
    runner: Runner, settings: Settings, *, description: str = "", overrides: dict | None = None
) -> RunResult:
    """Set up, warm up, time and tear down one run; failures are recorded, never raised.

    setup -> warm-up steps -> timed steps -> one forward + backward under CUDA's sync debug mode -> the optional
    diagnostic steps (profile, memory trace, host profile) -> teardown -> free memory. Out of memory anywhere
    becomes status "oom", a path that cannot run here (`SkipRun`, or a `ConfigError` from a speed path) "skipped",
    anything else "failed" with its traceback.

    MFU counts 6 x N x tokens FLOPs per step (N = parameters a token passes through: every parameter, embedding
    and LM head included, LoRA included, routed experts scaled by top-k / E) against `settings.peak_flops` (see
    `mfu_roof`: the matmul rate measured on a GPU at the start, or a peak the user gave; None: no MFU).
    Attention-score FLOPs (which grow with sequence length) and checkpoint recompute are not counted, so the
    number is comparable across runs and with the usual "6N" figures.

    Args:
        runner: the run.
        settings: steps, warm-up, device, tokens per step, the FLOP/s MFU is taken against.
        description, overrides: copied into the result for the record.

    Returns:
        The RunResult (status ok / oom / skipped / failed).
    """
    result = RunResult(
        name=runner.name,
        kind=runner.kind,
        description=description,
        overrides=dict(overrides or {}),
        tokens=settings.tokens,
        warmup_steps=settings.warmup,
        steps=settings.steps,
        memory_before_gib=allocated_gib(settings.device),
    )
    if settings.steps < 1:
        raise ValueError("at least one timed step is needed")
    try:
        _drive(runner, settings, result)
    except Exception as e:
        record_failure(result, e, settings.device)
        # The traceback's frames hold the failed step's tensors (activations of an OOM'd forward); an exception
        # kept alive anywhere would keep them, so their locals are dropped now.
        traceback.clear_frames(e.__traceback__)
        e.__traceback__ = None
    finally:
        try:
            runner.teardown()
        except Exception as e:  # keep the first failure's story; note a teardown one
            result.details += f"\nteardown failed: {type(e).__name__}: {e}"
    if not result.ok:
        # A failed run's numbers would mislead next to the others.
        result.tokens_per_s = result.median_step_s = result.mfu = None
    free_memory(settings.device)
    return result

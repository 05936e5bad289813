"""`hone bench S --max-length [LIMIT]`: the longest single row each run trains in one optimizer step.

For every run of the benchmark (the references, Hone's runs, the peer), a search over row lengths: one row of L
tokens, built fresh, one step under `--memory-cap` (as on a smaller GPU). Lengths double from the start until a
step runs out of memory or LIMIT is reached, then the gap between the longest length that trained and the shortest
that did not is halved until it is at most the search's granularity. A step that fails for another reason ends
that run's search with the reason. Every trial is recorded.

    report = run_max_length(BenchOptions(scenario="dense-8b", memory_cap=80 * 2**30), limit=1 << 20)
    report.runs[0].longest    # tokens; None when not even the first length trained
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hone.core.bench.batch import make_batch
from hone.core.bench.measure import RunResult, Settings, cap_fraction, capped_memory, free_memory, measure_run
from hone.core.bench.report import environment
from hone.core.bench.run import BenchOptions, _peer_spec, plan_runs, resolve_device, resolve_dtype
from hone.core.bench.scenarios import get_scenario
from hone.core.bench.weights import architecture_facts, remove_folder, saved_model_folder, vocab_size
from hone.core.errors import ConfigError

DEFAULT_LIMIT = 1 << 20  # 1M tokens: past any single-GPU result published for the shapes benchmarked
# The first length tried: a length every run trains on the GPU shapes, so the doubling wastes few trials;
# the tiny CPU shapes start at their usual longest row.
GPU_START, TINY_START = 8192, 64
# The search stops when the gap is at most an eighth of the start (1,024 tokens on the GPU shapes): finer steps
# cost a model build each and move the answer by well under 1 %.
GRANULARITY_SHARE = 8


@dataclass
class Trial:
    """One row length tried: "ok", "oom" or "failed" (with the reason), the step's peak GPU memory, time, the
    host memory its offloaded layer inputs took and the host memory available before the run was built (what the
    memory planner sizes the host's share from)."""

    length: int
    status: str
    reason: str = ""
    peak_allocated_gib: float | None = None
    step_s: float | None = None
    host_gib: float | None = None  # layer inputs offloaded to host memory (Hone's runs)
    host_available_gib: float | None = None  # system memory available before the run was built (None: not known)


@dataclass
class LongestRow:
    """One run's search: the longest row that trained in one step (None: not even the first length), the shortest
    that did not (None: none failed up to the limit), and every trial in order."""

    name: str
    kind: str
    description: str = ""
    longest: int | None = None
    first_failing: int | None = None
    limit: int = 0
    status: str = "ok"  # ok | skipped | failed (a trial failed for a reason other than memory)
    reason: str = ""
    trials: list[Trial] = field(default_factory=list)

    @property
    def at_longest(self) -> Trial | None:
        return next((t for t in self.trials if t.status == "ok" and t.length == self.longest), None)

    def to_dict(self) -> dict:
        return asdict(self)


def search_longest(trial: Callable[[int], Trial], start: int, limit: int, granularity: int) -> LongestRow:
    """Double from `start` while `trial(L)` is "ok" (up to `limit`), then bisect the gap down to `granularity`
    (lengths stay multiples of it). A "failed" trial ends the search. Returns a LongestRow without names."""
    if not 0 < granularity <= start <= limit:
        raise ValueError(f"need 0 < granularity ({granularity}) <= start ({start}) <= limit ({limit})")
    found = LongestRow(name="", kind="", limit=limit)
    low, high = 0, None  # longest ok, shortest not ok
    length = start
    while True:
        outcome = trial(length)
        found.trials.append(outcome)
        if outcome.status == "failed":
            found.status, found.reason = "failed", outcome.reason
            break
        if outcome.status != "ok":
            high = length
            break
        low = length
        if length >= limit:
            break
        length = min(2 * length, limit)
    while found.status == "ok" and high is not None and high - low > granularity:
        middle = (low + high) // 2 // granularity * granularity
        if middle <= low:
            break
        outcome = trial(middle)
        found.trials.append(outcome)
        if outcome.status == "failed":
            found.status, found.reason = "failed", outcome.reason
        elif outcome.status == "ok":
            low = middle
        else:
            high = middle
    found.longest, found.first_failing = (low or None), high
    return found


def _host_available_gib() -> float | None:
    from hone.core.machine.pinned_memory import available_system_memory

    available = available_system_memory()
    return available / 2**30 if available > 0 else None


def trial_of(result: RunResult) -> Trial:
    """A measured one-step run as a trial; a run that was skipped counts as failed (nothing to search)."""
    status = {"ok": "ok", "oom": "oom"}.get(result.status, "failed")
    step = result.step_times_s[0] if result.step_times_s else None
    return Trial(result.tokens, status, result.reason, result.peak_allocated_gib, step, result.offload_gib)


@dataclass
class MaxLengthReport:
    options: BenchOptions
    scenario: str
    device: str
    dtype: str
    environment: dict
    runs: list[LongestRow]
    elapsed_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "schema": 1,
            "kind": "max-length",
            "scenario": self.scenario,
            "options": asdict(self.options),
            "device": self.device,
            "dtype": self.dtype,
            "environment": self.environment,
            "runs": [r.to_dict() for r in self.runs],
            "elapsed_s": self.elapsed_s,
        }


def _check(options: BenchOptions, limit: int, start: int | None) -> None:
    if options.tokens is not None or options.seq_min is not None or options.seq_max is not None:
        raise ConfigError("--max-length searches the row length itself", "leave out --tokens, --seq-min and --seq-max")
    if limit < 16:
        raise ConfigError(f"--max-length {limit}: the limit is a row length in tokens", "give e.g. --max-length 524288")
    if start is not None and not 16 <= start <= limit:
        raise ConfigError(
            f"--max-length-from {start}: the first length tried is between 16 and the limit ({limit:,})",
            f"give e.g. --max-length {limit} --max-length-from {min(limit, GPU_START)}",
        )


def run_max_length(
    options: BenchOptions,
    *,
    limit: int = DEFAULT_LIMIT,
    start: int | None = None,
    on_result: Callable[[LongestRow], None] | None = None,
    on_start: Callable[[str], None] | None = None,
) -> MaxLengthReport:
    """Search each run's longest one-step row for the text scenario `options.scenario` (the runs `--only` picks;
    the peer with `--peer`). Each trial builds its run afresh on one row of that length: warm-up none, one step.

    Raises:
        ConfigError: a vision scenario, --tokens / --seq-* given, a limit below 16, a start outside [16, limit], what
            `plan_runs` refuses.
    """
    started = time.perf_counter()
    _check(options, limit, start)
    scenario = get_scenario(options.scenario)
    if scenario.kind != "text":
        raise ConfigError(f"--max-length searches text scenarios; {scenario.name} is a vision one", "")
    device = resolve_device(options.device)
    if options.memory_cap is not None:
        cap_fraction(device, options.memory_cap)
    dtype = resolve_dtype(options.dtype, device)
    facts, vocab = architecture_facts(scenario, options.layers), vocab_size(scenario)
    first = min(start or (TINY_START if scenario.name.startswith("tiny") else GPU_START), limit)
    granularity = max(first // GRANULARITY_SHARE, 8)
    model_folder = None
    if options.qlora and device.startswith("cuda"):
        model_folder = saved_model_folder(
            scenario, options.layers, seed=options.seed, dtype=dtype, device=device, cache_dir=options.model_cache
        )

    def planned_at(length: int):
        batch = make_batch(length, vocab, seed=options.seed, min_len=length, max_len=length)
        return batch, plan_runs(options, scenario, facts, batch, device, dtype, model_folder)

    def own_trial(name: str) -> Callable[[int], Trial]:
        def trial(length: int) -> Trial:
            batch, planned = planned_at(length)
            plan = next(p for p in planned if p.name == name)
            settings = Settings(
                warmup=0, steps=1, device=device, tokens=batch.tokens, peak_flops=None, count_syncs=False
            )
            available = _host_available_gib()
            with capped_memory(device, options.memory_cap):
                found = trial_of(measure_run(plan.make(), settings, description=plan.description))
            return dataclasses.replace(found, host_available_gib=available)

        return trial

    def peer_trial(length: int) -> Trial:
        from hone.core.bench.peer_unsloth import run_unsloth_peer

        batch, _ = planned_at(length)
        one_step = BenchOptions(**{**asdict(options), "warmup": 0, "steps": 1})
        spec = _peer_spec(one_step, scenario, batch, device, dtype, None)
        free_memory(device)
        available = _host_available_gib()
        return dataclasses.replace(trial_of(run_unsloth_peer(spec)), host_available_gib=available)

    runs: list[LongestRow] = []
    try:
        searches = [(p.name, p.kind, p.description, p.skip_reason, own_trial(p.name)) for p in planned_at(first)[1]]
        if options.peer == "unsloth":
            from hone.core.bench.peer_unsloth import unsloth_available

            missing = "" if unsloth_available() else "unsloth is not installed"
            searches.append(("unsloth", "peer", "Unsloth, in a process of its own", missing, peer_trial))
        for name, kind, description, skipped, trial in searches:
            if on_start:
                on_start(name)
            if skipped:
                found = LongestRow(name, kind, description, limit=limit, status="skipped", reason=skipped)
            else:
                found = search_longest(trial, first, limit, granularity)
                found.name, found.kind, found.description = name, kind, description
            runs.append(found)
            if on_result:
                on_result(found)
    finally:
        if options.model_cache is None:
            remove_folder(model_folder)
    return MaxLengthReport(
        options=options,
        scenario=scenario.name,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        environment=environment(device),
        runs=runs,
        elapsed_s=time.perf_counter() - started,
    )


def max_length_table(runs: list[LongestRow], title: str):
    """A rich Table: per run the longest row, the shortest that did not train, and the step at the longest."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header, justify in (
        ("run", "left"),
        ("status", "left"),
        ("longest row", "right"),
        ("first failing", "right"),
        ("peak GiB", "right"),
        ("host GiB", "right"),
        ("step s", "right"),
        ("trials", "right"),
        ("note", "left"),
    ):
        table.add_column(header, justify=justify)
    for run in runs:
        best = run.at_longest
        failing = run.first_failing
        if failing is None and run.longest == run.limit:
            note = "reached the limit"
        elif failing is not None:
            reason = next((t.reason for t in run.trials if t.length == failing), "")
            note = f"{failing:,}: {reason[:80]}"
        else:
            note = run.reason[:100]
        table.add_row(
            run.name,
            run.status,
            f"{run.longest:,}" if run.longest else "-",
            f"{failing:,}" if failing else "-",
            f"{best.peak_allocated_gib:.1f}" if best and best.peak_allocated_gib is not None else "-",
            f"{best.host_gib:.1f}" if best and best.host_gib is not None else "-",
            f"{best.step_s:.2f}" if best and best.step_s is not None else "-",
            str(len(run.trials)),
            note,
        )
    return table

"""The Train page's estimate on a computer without an NVIDIA GPU: the run's memory against the system memory
available (RAM), and how long it takes on this CPU. A job for the helper process (hone.app.helper_process): free of
Qt, its result a dataclass that pickles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hone.core.config import RunConfig


@dataclass(frozen=True)
class CpuPlan:
    """The memory plan (a RunPlan against system memory); the time estimate (a TimeEstimate) or None, and then
    `no_time` says why in words."""

    plan: Any
    time: Any = None
    no_time: str = ""


def plan_on_cpu(config: RunConfig, memory: Any = None, flops_per_s: float | None = None) -> CpuPlan:
    """Plan the run against `memory` (a Memory; None: the RAM available now) and time it at `flops_per_s` (None: this
    CPU's rate, measured once per helper process)."""
    from hone.core.api import detect_system_memory, epoch_tokens, estimate_run_time, measure_matmul_rate, plan_run

    plan = plan_run(config, memory if memory is not None else detect_system_memory(), allow_qlora=True)
    train = config.train
    if train.method == "grpo":
        return CpuPlan(plan, no_time="no estimate for GRPO, whose time goes mostly into sampling answers")
    tokens_per_epoch = None
    if not train.max_steps:
        if train.method != "sft":
            return CpuPlan(plan, no_time="set “Max steps” to see how long this run takes")
        try:
            tokens_per_epoch = epoch_tokens(config)
        except Exception as e:  # the data's own check (Data page, Start) says what is wrong; here only the time waits
            why = getattr(e, "message", "") or str(e)
            return CpuPlan(plan, no_time=f"the training data's tokens cannot be counted ({why})")
    rate = flops_per_s if flops_per_s is not None else measure_matmul_rate()
    return CpuPlan(plan, estimate_run_time(config, plan, rate, tokens_per_epoch))

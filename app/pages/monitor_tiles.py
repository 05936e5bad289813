"""The Monitor's numbers: the status pill, the progress line and ETA, and the loss, speed, memory and GPU tiles, from
what the page holds (its last step, the run's state, the telemetry's last sample)."""

from __future__ import annotations

from hone.app.run_status import status_word
from hone.app.widgets.common import human_bytes, human_duration
from hone.core.events import RunFinished, StepMetrics


def eta_seconds(step_times, steps_left: int) -> float:
    """Seconds until the last step, from the mean of recent step times."""
    if not step_times or steps_left <= 0:
        return 0.0
    return sum(step_times) / len(step_times) * steps_left


def waiting_text(step: StepMetrics) -> str:
    share = step.waiting_for_data
    return f" · waiting for data {share:.0%} of the step" if share else ""


def update_tiles(page) -> None:
    """Refresh the pill, the progress line and the tiles of the MonitorPage `page` from what it holds."""
    step = page.last_step
    shown = "elsewhere" if page.following is not None and page.status == "running" else page.status
    page.status_pill.setText(status_word(shown))
    colour_pill(page)
    if step:
        fraction = step.step / step.total_steps if step.total_steps else 0.0
        page.progress.setValue(int(fraction * 1000))
        page.progress_text.setText(
            f"Step {step.step:,} of {step.total_steps:,} · epoch {step.epoch:.2f} · "
            f"{human_duration(step.elapsed)} elapsed"
        )
        left = eta_seconds(page.step_times, step.total_steps - step.step)
        page.eta_text.setText(f"ETA {human_duration(left)}" if page.status in ("running", "paused") else "")
        smooth = page.loss_chart.series["smooth"].buffer
        smooth_text = f"smoothed {smooth.y[-1]:.4f} · " if smooth.n else ""
        if isinstance(page.ended, RunFinished):  # the number a finished run is remembered by
            page.loss_tile.set(
                f"{page.ended.final_loss:.4f}", f"final loss · {smooth_text}grad norm {step.grad_norm:.2f}"
            )
        else:
            page.loss_tile.set(f"{step.loss:.4f}", f"{smooth_text}grad norm {step.grad_norm:.2f}")
        page.speed_tile.set(
            f"{step.tokens_per_s:,.0f}",
            f"{step.step_time:.2f} s/step · packing {step.packing_efficiency:.0%}{waiting_text(step)}",
        )
    elif page.status in ("idle", "starting"):
        page.progress.setValue(0)
        page.progress_text.setText("")
        page.eta_text.setText("")
        page.loss_tile.set("—", "")
        page.speed_tile.set("—", "")
    sample = getattr(page, "_sample", None)
    past = page.started is not None and not page.live  # a run opened from Runs: this machine's now means nothing
    if past or sample is None:
        run_memory_tiles(page, step)
        return
    no_gpu = sample.memory_source == "system"
    page.memory_tile.set_title("System memory" if no_gpu else "GPU memory")
    page.gpu_tile.set_title("Device" if no_gpu else "GPU")
    source = {"gpu": "", "unified": " (unified memory)"}.get(sample.memory_source, " (system)")
    detail = f"of {human_bytes(sample.memory_total)}{source}"
    if step and step.mem_allocated:
        detail += f" · run peak {human_bytes(step.mem_allocated)}"
    page.memory_tile.set(human_bytes(sample.memory_used), detail)
    if no_gpu:
        page.gpu_tile.set("CPU", "no NVIDIA GPU: nothing to measure")
        page.util_chart.headline.setText("no NVIDIA GPU")
        page.util_chart.set_empty_text("No NVIDIA GPU on this computer, so there is no GPU load to show")
        return
    parts = [
        f"{sample.temperature:.0f} °C" if sample.temperature is not None else "",
        f"{sample.power:.0f} W" if sample.power is not None else "",
    ]
    page.gpu_tile.set(
        f"{sample.utilization:.0f}%" if sample.utilization is not None else "—",
        " · ".join(p for p in parts if p) or sample.device,
    )
    page.util_chart.headline.setText(" · ".join([sample.device] + [p for p in parts if p]))


def run_memory_tiles(page, step: StepMetrics | None) -> None:
    """Memory as the run itself recorded it (a past run, or no telemetry)."""
    page.memory_tile.set_title("Run memory")
    page.gpu_tile.set_title("Device")
    if step and step.mem_allocated:
        page.memory_tile.set(
            human_bytes(step.mem_allocated), f"peak allocated · reserved {human_bytes(step.mem_reserved)}"
        )
    else:
        page.memory_tile.set("—", "not recorded (CPU run)" if page.started else "")
    page.gpu_tile.set(page.started.device if page.started else "—", "")


def colour_pill(page) -> None:
    # a failure must read as one at a glance; every other state keeps the stylesheet's pill colours
    if page.status == "failed" and page.palette_:
        page.status_pill.setStyleSheet(f"background: {page.palette_.danger}; color: #ffffff;")
    else:
        page.status_pill.setStyleSheet("")

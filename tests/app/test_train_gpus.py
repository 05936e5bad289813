"""The Train page's GPU choice: on a machine with several NVIDIA GPUs one box per GPU (the first ticked), Start
with two ticked trains through `hone train --gpus 2` in a child process, the Monitor cannot pause that run, and a
step's per-GPU memory becomes one line per GPU. Here the child refuses (this machine has no GPUs), and the Monitor
shows its reason."""

from __future__ import annotations

import json

import pytest
import torch

from hone.core.api import MachineFacts
from hone.core.events import StepMetrics
from hone.core.machine.telemetry import GpuListing


def ready_to_start(window, tiny_model_dir) -> None:
    """The tiny model and the bundled demo data chosen, settings a short CPU run takes."""
    from hone.core.config import DEMO_TRAIN_DATA
    from hone.core.models.load import count_params, info_from_config
    from hone.core.models.shapes import build_model

    model = build_model("tiny-dense")
    window.state.set_model(
        str(tiny_model_dir("tiny-dense")), info_from_config(model.config, "tiny-dense", "folder", count_params(model))
    )
    window.state.update(
        f"data.train=[{json.dumps(DEMO_TRAIN_DATA)}]",
        "train.max_steps=2",
        "train.batch_tokens=256",
        "data.max_length=256",
    )


TWO_GPUS = MachineFacts(
    gpu="NVIDIA H200", gpus=(GpuListing(0, "NVIDIA H200", 141 * 2**30), GpuListing(1, "NVIDIA H200", 141 * 2**30))
)


def test_one_gpu_shows_no_choice(make_window):
    window = make_window(machine=MachineFacts(gpu="NVIDIA H200", gpus=(GpuListing(0, "NVIDIA H200", 2**34),)))
    page = window.page("train")
    assert page.gpu_card.isHidden() and page.selected_gpus() == []


def test_each_gpu_has_a_box_and_none_ticked_stops_start(make_window, tiny_model_dir):
    window = make_window(machine=TWO_GPUS)
    ready_to_start(window, tiny_model_dir)
    page = window.page("train")
    assert not page.gpu_card.isHidden()
    assert [b.text() for b in page.gpu_boxes] == ["GPU 0 · NVIDIA H200 · 141 GiB", "GPU 1 · NVIDIA H200 · 141 GiB"]
    assert page.selected_gpus() == [0]
    page.gpu_boxes[0].setChecked(False)
    assert "Tick at least one GPU to train on." in page.problems.text() and not page.start_button.isEnabled()
    page.gpu_boxes[1].setChecked(True)
    page.gpu_boxes[0].setChecked(True)
    assert page.selected_gpus() == [0, 1] and "on 2 GPUs" in page.summary_text.text()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs: the child would train")
def test_start_on_two_gpus_runs_the_child_and_shows_what_it_says(qtbot, make_window, tiny_model_dir):
    window = make_window(machine=TWO_GPUS)
    ready_to_start(window, tiny_model_dir)
    page, monitor = window.page("train"), window.page("monitor")
    page.gpu_boxes[1].setChecked(True)
    page.start()
    session = window.state.session
    assert session.gpus == [0, 1] and not session.can_pause
    assert not monitor.pause_button.isEnabled() and "several GPUs" in monitor.pause_button.toolTip()
    qtbot.waitUntil(lambda: not session.is_running, timeout=120_000)
    assert monitor.status == "failed"
    assert "asks for 2 NVIDIA GPUs, and this machine has 0" in monitor.failure_dialog.text()


def test_per_gpu_memory_is_one_line_per_gpu(make_window):
    window = make_window(machine=TWO_GPUS)
    monitor = window.page("monitor")
    monitor.live = True
    step = StepMetrics(
        step=1,
        total_steps=4,
        epoch=0.0,
        loss=1.0,
        lr=1e-4,
        grad_norm=1.0,
        tokens=512,
        trained_tokens=400,
        tokens_per_s=1000.0,
        step_time=0.5,
        elapsed=0.5,
        mem_allocated=3 * 2**30,
        mem_reserved=4 * 2**30,
        mem_by_gpu=[3 * 2**30, 5 * 2**30],
    )
    monitor._step(step)
    chart = monitor.memory_chart
    assert [name for name, _ in chart.legend_entries() if name.startswith("GPU")] == ["GPU 0 (peak)", "GPU 1 (peak)"]
    assert list(chart.points("gpu1")[1]) == [5.0] and len(chart.points("allocated")[1]) == 0
    monitor._reset()  # the next run: its own lines
    assert not [key for key in chart.series if key.startswith("gpu")]


def test_splitting_the_model_across_gpus_says_what_it_cannot_split(make_window, tiny_model_dir):
    """train.parallel = fsdp on several ticked GPUs with 4-bit base weights: the trainer would refuse it, so the
    form says why before Start (and says nothing on one GPU, where nothing is split)."""
    window = make_window(machine=TWO_GPUS)
    ready_to_start(window, tiny_model_dir)
    page = window.page("train")
    window.state.update('train.parallel="fsdp"', "lora.qlora=true")
    assert not any("Split the model" in p for p in page.problem_list())  # one GPU ticked
    page.gpu_boxes[1].setChecked(True)
    problems = [p for p in page.problem_list() if p.startswith("Split the model across GPUs")]
    assert len(problems) == 1 and "4-bit" in problems[0], page.problem_list()
    assert "lora.qlora" not in problems[0] and not page.start_button.isEnabled()

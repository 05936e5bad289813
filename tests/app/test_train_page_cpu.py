"""On a computer without an NVIDIA GPU the Train page says, before Start, how much RAM the run needs against the RAM
available and how long it takes on this CPU (a range); on a GPU machine no time line shows. The machine and its
memory are given by the tests; the CPU's rate too where the numbers are checked."""

from __future__ import annotations

import json

import pytest

from hone.app.widgets.memory_estimate import duration_text
from hone.core.api import MachineFacts
from hone.core.memory.run_plan import Memory

GIB = 1024**3
NO_GPU = MachineFacts(gpu="", reason="no NVIDIA GPU found")
GPU = MachineFacts(gpu="NVIDIA H200", bitsandbytes=True)
RAM = Memory(8 * GIB, "this computer (system memory)", gpu=False)
RATE = 2e10  # flop/s, as if the probe had measured it


@pytest.mark.parametrize(
    ("low_s", "high_s", "text"),
    [
        (30, 50, "under a minute"),
        (100, 400, "about 1–7 min"),
        (21.3 * 60, 44.2 * 60, "about 20–45 min"),
        (12 * 60, 14 * 60, "about 10–15 min"),
        (40 * 60, 150 * 60, "about 0.5–2.5 h"),
        (3.2 * 3600, 11.5 * 3600, "about 3–12 h"),
        (3 * 86400, 7.2 * 86400, "about 3–8 days"),
    ],
)
def test_durations_in_words(low_s, high_s, text):
    assert duration_text(low_s, high_s) == text


def estimate_on(qtbot, window, memory, rate=RATE):
    page = window.page("train")
    page.memory_source = lambda: memory
    page.cpu_rate = rate
    earlier = page.estimate_task
    window.show_page("train")
    page._estimate_timer.start()
    qtbot.waitUntil(
        lambda: page.estimate_task not in (None, earlier) and not page.estimate_task.is_running(), timeout=120_000
    )
    qtbot.wait(50)  # the result's callback, queued to this thread
    return page


def choose_tiny(window, tiny_model_dir, *settings):
    window.state.set_model(tiny_model_dir("tiny-dense").as_posix(), {"name": "tiny", "is_moe": False})
    window.state.update(*settings)


def test_a_cpu_run_says_the_ram_it_needs_and_how_long_it_takes(qtbot, make_window, tiny_model_dir):
    from hone.core.api import estimate_run_time, plan_run

    window = make_window(machine=NO_GPU)
    choose_tiny(window, tiny_model_dir)
    window.page("train").preset_buttons["CPU quick test"].click()
    page = estimate_on(qtbot, window, RAM)
    plan = plan_run(window.state.config, RAM)
    assert plan.settings.cpu
    assert page.memory.fits is True
    assert (
        page.memory.text.text()
        == f"Needs ≈ {plan.estimate.peak_gib:.1f} GiB of RAM; 8.0 GiB available on this computer."
    )
    expected = estimate_run_time(window.state.config, plan, RATE)
    assert expected.tokens == 10 * 512
    assert page.memory.time_text.isVisibleTo(page)
    assert page.memory.time_text.text() == (
        f"Time: {duration_text(expected.low_s, expected.high_s)} on this CPU, for 5,120 tokens."
    )
    assert "20 GFLOP/s" in page.memory.time_text.toolTip()
    assert page.start_button.isEnabled() or page.problem_list()  # the estimate never blocks Start by itself


def test_more_ram_than_there_is_turns_red(qtbot, make_window):
    window = make_window(machine=NO_GPU)
    window.state.set_model("dense-8b", {"name": "Qwen3-8B shape", "is_moe": False})  # a shape: no files to read
    window.state.update("train.max_steps=5", "train.batch_tokens=4096", "data.max_length=2048", "lora.qlora=false")
    page = estimate_on(qtbot, window, Memory(4 * GIB, "this computer (system memory)", gpu=False))
    assert page.memory.fits is False
    text = page.memory.text.text()
    assert " GiB of RAM: " in text and "4.0 GiB of RAM available on this computer" in text, text
    assert "GPU" not in text


def test_a_run_by_epochs_counts_the_datas_tokens(qtbot, make_window, tiny_model_dir):
    from hone.core.api import check_data, estimate_run_time, plan_run, tokenizer_for
    from hone.core.config import DEMO_TRAIN_DATA

    window = make_window(machine=NO_GPU)
    choose_tiny(window, tiny_model_dir, f"data.train=[{json.dumps(DEMO_TRAIN_DATA)}]", "train.max_steps=0")
    window.state.update("train.epochs=2.0", "data.max_length=256")
    page = estimate_on(qtbot, window, RAM)
    config = window.state.config
    report, _ = check_data(config.data, tokenizer_for(config.model), split="train")
    assert report.tokens > 0
    expected = estimate_run_time(config, plan_run(config, RAM), RATE, tokens_per_epoch=report.tokens)
    assert expected.tokens == 2 * report.tokens
    assert page.memory.time_text.text() == (
        f"Time: {duration_text(expected.low_s, expected.high_s)} on this CPU, for {2 * report.tokens:,} tokens."
    )


def test_the_cpu_rate_is_measured_in_the_helper_when_not_given(qtbot, make_window, tiny_model_dir):
    window = make_window(machine=NO_GPU)
    choose_tiny(window, tiny_model_dir, "train.max_steps=10")
    page = estimate_on(qtbot, window, RAM, rate=None)
    assert page.memory.time_text.text().startswith("Time: ") and " on this CPU" in page.memory.time_text.text()
    assert "GFLOP/s measured here" in page.memory.time_text.toolTip()


def test_a_gpu_machine_shows_no_time_line(qtbot, make_window, tiny_model_dir):
    window = make_window(machine=GPU)
    choose_tiny(window, tiny_model_dir, "train.max_steps=10")
    page = estimate_on(qtbot, window, Memory(24 * GIB, "NVIDIA GeForce RTX 4090"))
    assert "of 24.0 GiB on NVIDIA GeForce RTX 4090" in page.memory.text.text()
    assert not page.memory.time_text.isVisibleTo(page)

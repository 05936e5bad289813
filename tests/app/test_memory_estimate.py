"""The Train page's memory estimate: what the run needs against the GPU's memory, red with a one-click fix when it
does not fit (the memory is given by the test: this machine has no GPU)."""

from __future__ import annotations

from hone.core.memory.run_plan import Memory

GIB = 1024**3


def estimate_on(qtbot, window, memory):
    train = window.page("train")
    train.memory_source = lambda: memory
    earlier = train.estimate_task
    window.show_page("train")
    train._estimate_timer.start()
    qtbot.waitUntil(
        lambda: train.estimate_task not in (None, earlier) and not train.estimate_task.is_running(), timeout=60_000
    )
    qtbot.wait(50)  # the result's callback, queued to this thread
    return train


def test_a_run_that_fits_says_how_much_of_the_gpu_it_needs(qtbot, make_window, tiny_model_dir):
    window = make_window()
    window.page("model").choose(tiny_model_dir("tiny-dense").as_posix())
    qtbot.waitUntil(lambda: window.state.model_info is not None, timeout=60_000)
    train = estimate_on(qtbot, window, Memory(24 * GIB, "NVIDIA GeForce RTX 4090"))
    assert train.memory.fits is True
    assert (
        train.memory.text.text().startswith("Needs ≈ ")
        and "of 24.0 GiB on NVIDIA GeForce RTX 4090" in train.memory.text.text()
    )
    assert "each MLP is back-propagated whole" in train.memory.text.text()  # a tiny model: memory to spare
    assert not train.memory.fix_button.isVisible()
    assert [name for name, _ in train.memory.bar.parts][:2] == ["weights", "vocabulary tables"]


def test_too_big_for_the_card_turns_red_and_one_click_makes_it_fit(qtbot, make_window):
    window = make_window()
    window.state.set_model("dense-8b", {"name": "Qwen3-8B shape", "is_moe": False})  # a shape: no files to inspect
    window.state.update("train.batch_tokens=16384", "data.max_length=2048", "lora.qlora=false")
    train = estimate_on(qtbot, window, Memory(12 * GIB, "NVIDIA GeForce RTX 4070"))
    assert train.memory.fits is False and "more than the 12.0 GiB" in train.memory.text.text()
    assert "base weights in 4-bit (QLoRA)" in train.memory.text.text()
    assert train.memory.fix_button.isVisible()
    train.memory.fix_button.click()
    assert window.state.config.lora.qlora
    train = estimate_on(qtbot, window, Memory(12 * GIB, "NVIDIA GeForce RTX 4070"))
    assert train.memory.fits is True and not train.memory.fix_button.isVisible()


def test_nothing_fits_says_how_much_is_free_and_why(qtbot, make_window):
    window = make_window()
    window.state.set_model("dense-8b", {"name": "Qwen3-8B shape", "is_moe": False})
    window.state.update("train.batch_tokens=16384", "data.max_length=2048")
    train = estimate_on(qtbot, window, Memory(2 * GIB, "NVIDIA GeForce GTX 1050"))
    assert train.memory.fits is False
    assert "does not fit the 2.0 GiB free on NVIDIA GeForce GTX 1050. " in train.memory.text.text()


def test_without_a_gpu_it_says_the_ram_the_run_needs_of_what_is_available(qtbot, make_window, tiny_model_dir):
    from hone.core.api import MachineFacts

    window = make_window(machine=MachineFacts(gpu="", reason="no NVIDIA GPU found"))
    window.state.set_model(tiny_model_dir("tiny-dense").as_posix(), {"name": "tiny", "is_moe": False})
    train = estimate_on(qtbot, window, None)  # None: the RAM this computer has available now
    assert train.memory.fits is True, train.memory.text.text()
    assert " GiB of RAM; " in train.memory.text.text() and "GiB available on this computer." in train.memory.text.text()


def test_no_estimate_before_a_model_is_chosen(qtbot, make_window):
    window = make_window()
    window.state.model_info = None
    train = window.page("train")
    window.show_page("train")
    train._estimate()
    assert train.estimate_task is None and train.memory.text.text().startswith("Memory: choose a model")


def test_inputs_the_host_cannot_hold_are_counted_on_the_gpu_and_said_without_a_fix(qtbot, make_window):
    window = make_window()
    window.state.set_model("dense-8b", {"name": "Qwen3-8B shape", "is_moe": False})
    window.state.update("train.batch_tokens=393216", "data.max_length=393216", "speed.checkpoint=offload-double")
    # 48 GiB of RAM: the tables and 10 of the 36 layer inputs of 3 GiB; a 200 GiB card holds the other 26.
    train = estimate_on(qtbot, window, Memory(200 * GIB, "a 200 GiB card", host=(2.32 + 30.5) / 0.85 * GIB))
    text = train.memory.text.text()
    assert train.memory.fits is True and not train.memory.fix_button.isVisible(), text
    assert "26 of 36 layer inputs kept on the GPU" in text
    bar_total = sum(size for _, size in train.memory.bar.parts)
    assert bar_total > 26 * 3 * GIB  # the estimate shown counts them on the GPU

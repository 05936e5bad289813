"""The preset sized for a CPU: its values, the same settings every preset names, and the Train page offering it only
on a machine without an NVIDIA GPU."""

from __future__ import annotations

from hone.app.presets import CPU_PRESET, PRESETS, PRESETS_BY_NAME, matching_preset, presets_for
from hone.core.api import MachineFacts
from hone.core.config import RunConfig

NO_GPU = MachineFacts(gpu="", reason="no NVIDIA GPU found")
GPU = MachineFacts(gpu="NVIDIA H200", bitsandbytes=True)


def _keys(preset) -> set[str]:
    return {override.split("=", 1)[0] for override in preset.overrides}


def test_the_cpu_preset_is_small_and_needs_no_gpu():
    preset = PRESETS_BY_NAME[CPU_PRESET]
    config = preset.apply(RunConfig())
    assert config.train.max_steps == 10 and config.train.batch_tokens == 512 and config.train.grad_accum == 1
    assert config.data.max_length == 256 and config.lora.r == 4 and config.lora.alpha == 8.0
    assert not config.lora.qlora and config.train.optimizer == "adamw"  # QLoRA and the 8-bit optimizer need a GPU
    assert config.speed.checkpoint == "off"  # recomputing costs time, and these rows need little memory
    assert config.train.eval_every == 0 and config.output.checkpoint_every == 0
    # 10 steps of 512 tokens: a twelfth of the 61,440 tokens of Quick test
    quick = PRESETS_BY_NAME["Quick test"].apply(RunConfig()).train
    assert quick.max_steps * quick.batch_tokens * quick.grad_accum == 10 * 512 * 12
    assert matching_preset(config) == CPU_PRESET


def test_every_preset_names_the_same_settings():
    assert all(_keys(preset) == _keys(PRESETS[0]) for preset in PRESETS)


def test_presets_offered_by_machine():
    names = [p.name for p in presets_for(has_gpu=False)]
    assert CPU_PRESET in names and "Quick test" in names
    assert CPU_PRESET not in [p.name for p in presets_for(has_gpu=True)]


def test_the_train_page_offers_it_without_a_gpu(make_window):
    window = make_window(machine=NO_GPU)
    page = window.page("train")
    window.show_page("train")
    assert page.preset_buttons[CPU_PRESET].isVisible()
    page.preset_buttons[CPU_PRESET].click()
    assert window.state.config.data.max_length == 256 and window.state.config.train.max_steps == 10
    assert page.preset_buttons[CPU_PRESET].isChecked() and page.start_button.text() == "Start training"
    window.state.set_machine(GPU)
    assert not page.preset_buttons[CPU_PRESET].isVisible()
    assert page.preset_buttons["Quick test"].isVisible()


def test_a_gpu_machine_is_not_offered_it(make_window):
    window = make_window(machine=GPU)
    page = window.page("train")
    window.show_page("train")
    assert not page.preset_buttons[CPU_PRESET].isVisible()

"""Runs the trainer would refuse cannot be started: the Train page finds them against the detected machine."""

from __future__ import annotations

import time

import pytest

from hone.app.presets import PRESETS, PRESETS_BY_NAME
from hone.core.api import MachineFacts
from hone.core.config import RunConfig
from hone.core.errors import ConfigError

NO_GPU = MachineFacts(gpu="", bitsandbytes=True, reason="no NVIDIA GPU found")
GPU = MachineFacts(gpu="NVIDIA H200", bitsandbytes=True)


def _problems(page) -> str:
    return page.problems.text() if page.problems.isVisibleTo(page) else ""


@pytest.mark.parametrize("before", [p.name for p in PRESETS])
def test_a_preset_gives_the_same_settings_whichever_preset_came_before(make_window, before):
    window = make_window(machine=GPU)
    page = window.page("train")
    base = window.state.config
    page.preset_buttons[before].click()
    for preset in PRESETS:
        page.preset_buttons[preset.name].click()
        expected = PRESETS_BY_NAME[preset.name].apply(base)  # from the untouched config, not the previous preset
        assert window.state.config == expected, (before, preset.name)


def test_a_gpu_only_preset_on_a_machine_without_a_gpu_cannot_start_and_says_why(make_window):
    window = make_window(machine=NO_GPU)
    page = window.page("train")
    assert page.start_button.isEnabled()
    page.preset_buttons["Laptop 8 GB"].click()
    assert not page.start_button.isEnabled()
    text = _problems(page)
    for what in ("QLoRA", "8-bit optimizer", "Offloading activations"):
        assert what in text and "needs an NVIDIA GPU" in text, text
    page.start()
    assert not window.state.session.is_running
    page.preset_buttons["Quick test"].click()  # resets every GPU-only choice Laptop made
    assert page.start_button.isEnabled(), _problems(page)


def test_the_same_preset_starts_on_a_gpu_machine_and_asks_for_bitsandbytes_without_it(make_window):
    window = make_window(machine=GPU)
    page = window.page("train")
    page.preset_buttons["Laptop 8 GB"].click()
    assert page.start_button.isEnabled(), _problems(page)
    window.state.set_machine(MachineFacts(gpu="NVIDIA H200", bitsandbytes=False))
    assert not page.start_button.isEnabled()
    assert "bitsandbytes" in _problems(page) and 'pip install "hone-studio[gpu]"' in _problems(page)


def test_a_data_file_that_does_not_exist_blocks_start(make_window, tmp_path):
    window = make_window(machine=GPU)
    page = window.page("train")
    missing = tmp_path / "gone.jsonl"
    window.state.update(f"data.train=[{str(missing)!r}]")
    assert not page.start_button.isEnabled()
    assert "gone.jsonl" in _problems(page) and "does not exist" in _problems(page)
    missing.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    window.state.update(f"data.train=[{str(missing)!r}]")
    assert page.start_button.isEnabled(), _problems(page)


def test_max_length_above_the_tokens_per_batch_blocks_start_in_words(make_window):
    window = make_window(machine=GPU)
    page = window.page("train")
    page.form.editors["train.batch_tokens"].setValue(2048)
    page.form.editors["data.max_length"].setValue(4096)  # RunConfig's own check across sections refuses this
    assert not page.start_button.isEnabled()
    text = _problems(page)
    assert "Max length" in text and "Tokens per batch" in text
    assert "Max length" in page.form.error_text("data.max_length"), "shown under the field too"
    assert "data.max_length" not in text, "messages name settings as the form does; keys are for tooltips"


def test_a_check_across_sections_that_runconfig_raises_shows_on_the_form(make_window, monkeypatch):
    window = make_window(machine=GPU)
    page = window.page("train")

    def refuse(self):  # stands for any check RunConfig makes across its sections
        if self.lora.r == 48:
            raise ConfigError("lora.r is 48, which this config refuses", "set lora.r to another value")

    monkeypatch.setattr(RunConfig, "__post_init__", refuse)
    page.form.editors["lora.r"].setValue(48)
    assert not page.start_button.isEnabled()
    assert "“Rank” is 48" in page.form.error_text("lora.r")
    assert "“Rank” is 48" in _problems(page)


def test_settings_cannot_be_edited_while_a_run_trains(qtbot, make_window):
    from hone.core.events import RunFinished

    def waiting(config, control, resume=None):
        while not control.stop_requested:
            time.sleep(0.01)
        yield RunFinished(step=0, run_dir="", adapter_dir="", final_loss=0.0, elapsed=0.0, stopped=True)

    window = make_window(machine=GPU, trainer=waiting)
    page = window.page("train")
    page.start()
    qtbot.waitUntil(lambda: window.state.session.is_running)
    assert not page.form.isEnabled() and not page.preset_buttons["Quick test"].isEnabled()
    window.state.session.stop()
    qtbot.waitUntil(lambda: not window.state.session.is_running, timeout=5000)
    assert page.form.isEnabled()

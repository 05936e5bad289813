"""The Train page's Basic and Advanced forms: Basic shows the settings a beginner chooses (and the chosen method's own
card), Advanced every one; hiding a setting never changes it, a line says how many hidden ones differ from their
defaults (or the preset's), and the choice is remembered across restarts."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtCore import QSettings

from hone.app.settings import Settings
from hone.app.widgets.config_form import BASIC_FIELDS, ELSEWHERE
from hone.core.api import MachineFacts
from hone.core.config import SECTIONS

GPU = MachineFacts(gpu="NVIDIA H200", bitsandbytes=True)
BASIC = {"train.method", "train.max_steps", "train.epochs", "train.lr", "lora.r", "lora.qlora"}


def shown_editors(page) -> set[str]:
    return {key for key, editor in page.form.editors.items() if editor.isVisibleTo(page)}


def shown_cards(page) -> set[str]:
    return {section for section, card in page.form.cards.items() if card.isVisibleTo(page)}


@pytest.fixture
def page(make_window):
    window = make_window(machine=GPU)
    window.show_page("train")
    return window.page("train")


def test_a_new_user_sees_basic_and_only_the_basic_settings(page):
    assert set(BASIC_FIELDS) == BASIC
    assert page.basic_button.isChecked() and not page.advanced_button.isChecked()
    assert shown_editors(page) == BASIC
    assert shown_cards(page) == {"train", "lora"}
    assert page.memory.isVisibleTo(page) and page.summary.isVisibleTo(page)  # the memory estimate stays in Basic
    assert page.preset_buttons["Balanced"].isVisibleTo(page)
    assert page.hidden_note.isHidden()  # a new user's hidden settings are all at their defaults


def test_advanced_shows_every_setting(page):
    page.advanced_button.click()
    every = {
        f"{section}.{name}"
        for section, cls in SECTIONS.items()
        for name in (f.name for f in dataclasses.fields(cls))
        if f"{section}.{name}" not in ELSEWHERE and f"{section}.{name}" != "data.columns"
    }
    assert shown_editors(page) == every
    assert shown_cards(page) == set(page.form.cards)
    assert page.hidden_note.isHidden()


def test_the_chosen_methods_card_shows_in_basic(page):
    method = page.form.editors["train.method"]
    method.setCurrentIndex(method.findData("dpo"))
    assert shown_cards(page) == {"train", "lora", "preference"}
    assert "preference.beta" in shown_editors(page) and page.state.config.train.method == "dpo"
    method.setCurrentIndex(method.findData("grpo"))
    assert shown_cards(page) == {"train", "lora", "grpo"}
    assert "grpo.num_generations" in shown_editors(page)
    method.setCurrentIndex(method.findData("sft"))
    assert shown_cards(page) == {"train", "lora"}


def test_switching_to_basic_keeps_every_hidden_value_and_counts_them(page):
    state = page.state
    page.advanced_button.click()
    page.form.editors["train.batch_tokens"].setValue(4096)
    page.form.editors["speed.compile"].setChecked(True)
    page.form.editors["data.max_length"].setValue(1024)
    before = state.config
    assert (before.train.batch_tokens, before.speed.compile, before.data.max_length) == (4096, True, 1024)

    page.basic_button.click()
    assert state.config == before, "hiding settings changes none of them"
    assert page.form.config() == before  # what Start trains with
    assert page.hidden_note.isVisibleTo(page)
    assert page.hidden_note.text() == (
        "3 advanced settings changed from the defaults: Tokens per batch, torch.compile and Max length (tokens)."
    )
    assert "Tokens per batch: 4096 (default 8192)" in page.hidden_note.toolTip()

    page.form.editors["lora.r"].setValue(32)  # a Basic edit leaves the count as it is
    assert page.hidden_note.text().startswith("3 advanced settings changed")


def test_a_presets_hidden_values_are_not_changes_until_edited(page):
    page.preset_buttons["Quick test"].click()  # sets Tokens per batch, Max length and more, hidden in Basic
    assert page.hidden_note.isHidden()
    page.advanced_button.click()
    page.form.editors["train.batch_tokens"].setValue(4096)
    page.basic_button.click()
    assert page.hidden_note.text() == "1 advanced setting changed from Quick test: Tokens per batch."
    assert page.state.config.train.batch_tokens == 4096 and page.state.config.data.max_length == 512


def test_the_choice_is_remembered_across_restarts(make_window, settings, tmp_path):
    window = make_window(machine=GPU)
    window.page("train").advanced_button.click()
    window.close()
    again = make_window(machine=GPU).page("train")
    assert again.advanced_button.isChecked() and "speed.compile" in again.form.editors
    assert again.form.editors["speed.compile"].isVisibleTo(again)
    reread = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat))
    assert reread.train_form() == "advanced"
    again.basic_button.click()
    assert settings.train_form() == "basic"


def test_the_moe_card_is_advanced_and_the_gpu_choice_basic(make_window):
    from hone.core.machine.telemetry import GpuListing

    two = MachineFacts(
        gpu="NVIDIA H200", gpus=(GpuListing(0, "NVIDIA H200", 2**34), GpuListing(1, "NVIDIA H200", 2**34))
    )
    window = make_window(machine=two)
    window.show_page("train")
    page = window.page("train")
    window.state.set_model("moe-qwen3", {"name": "Qwen3 MoE shape", "is_moe": True})
    assert not page.moe_card.isVisibleTo(page)
    assert page.gpu_card.isVisibleTo(page) and page.selected_gpus() == [0]  # which GPUs train is no hidden setting
    page.advanced_button.click()
    assert page.gpu_card.isVisibleTo(page) and page.moe_card.isVisibleTo(page)


def test_an_unknown_saved_choice_reads_as_basic(settings):
    settings.set_value("train/form", "expert")  # written by some other version
    assert settings.train_form() == "basic"
    with pytest.raises(ValueError):
        settings.set_train_form("expert")

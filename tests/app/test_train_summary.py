"""The Train page's "This run" summary and preset highlight follow the form: while a field holds an invalid value
they say so (naming the field as the form labels it) instead of showing the last valid config."""

from __future__ import annotations

import pytest


@pytest.fixture
def page(window):
    window.show_page("train")
    return window.page("train")


def _type(qtbot, editor, text: str) -> None:
    editor.lineEdit().selectAll()
    qtbot.keyClicks(editor.lineEdit(), text)


def test_an_invalid_value_replaces_the_summary_and_clears_the_preset(qtbot, page):
    page.preset_buttons["Balanced"].click()
    assert page.preset_buttons["Balanced"].isChecked()
    assert "rank 16" in page.summary_text.text() and "8,192 tokens per batch" in page.summary_text.text()

    _type(qtbot, page.form.editors["train.lr"], "5")  # above the field's maximum of 1.0
    qtbot.waitUntil(lambda: page.form.error_text("train.lr") != "")
    assert page.summary_text.text() == "The form has an invalid value in “Learning rate”: fix it to see this run."
    assert [name for name, b in page.preset_buttons.items() if b.isChecked()] == [], "no preset matches a bad form"
    assert page.preset_note.text() == "Fix the invalid value to compare the settings with the presets."

    _type(qtbot, page.form.editors["train.lr"], "0.0002")  # Balanced's own learning rate
    qtbot.waitUntil(lambda: page.form.error_text("train.lr") == "")
    assert [name for name, b in page.preset_buttons.items() if b.isChecked()] == ["Balanced"]
    assert "rank 16" in page.summary_text.text() and "8,192 tokens per batch" in page.summary_text.text()


def test_the_summary_shows_the_forms_values_once_valid_again(qtbot, page):
    page.preset_buttons["Quick test"].click()
    page.form.editors["lora.r"].setValue(24)
    assert "rank 24" in page.summary_text.text()
    _type(qtbot, page.form.editors["train.lr"], "-1")
    qtbot.waitUntil(lambda: page.form.error_text("train.lr") != "")
    page.form.editors["train.batch_tokens"].setValue(3072)  # a valid edit while another field is still bad
    assert "“Learning rate”" in page.summary_text.text()
    assert "3,072" not in page.summary_text.text() and "2,048" not in page.summary_text.text()
    assert page.memory.text.text() == "Memory: fix the invalid value to see what this run needs."
    _type(qtbot, page.form.editors["train.lr"], "0.0003")
    qtbot.waitUntil(lambda: page.form.error_text("train.lr") == "")
    assert "rank 24" in page.summary_text.text() and "3,072 tokens per batch × 1" in page.summary_text.text()
    assert not any(b.isChecked() for b in page.preset_buttons.values())
    assert page.preset_note.text() == "Custom settings."


def test_two_invalid_fields_are_both_named_in_the_forms_order(qtbot, page):
    _type(qtbot, page.form.editors["data.eval_fraction"], "0.9")  # above its maximum of 0.5
    _type(qtbot, page.form.editors["train.lr"], "5")
    qtbot.waitUntil(lambda: bool(page.form.error_text("train.lr") and page.form.error_text("data.eval_fraction")))
    assert page.summary_text.text() == (
        "The form has invalid values in “Learning rate” and “Eval fraction”: fix them to see this run."
    )

"""The Train form is generated from RunConfig's field metadata and validates inline, before Start."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

from hone.app.presets import PRESETS, matching_preset
from hone.app.widgets.config_form import ELSEWHERE, ConfigForm
from hone.core.config import SECTIONS, RunConfig

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _fields():
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            if key not in ELSEWHERE and typing.get_origin(hints[f.name]) is not dict:
                yield key, hints[f.name], f.metadata


def test_every_field_has_an_editor_built_from_its_metadata(qtbot):
    form = ConfigForm()
    qtbot.addWidget(form)
    keys = [key for key, _, _ in _fields()]
    assert sorted(form.editors) == sorted(keys), "the form must cover exactly the fields not chosen elsewhere"
    for key, hint, meta in _fields():
        editor = form.editors[key]
        assert editor.toolTip() == meta["help"].replace("`", "") + f"\n\n{key}", key  # the key only in tooltips
        if meta.get("choices"):
            assert isinstance(editor, QComboBox), key
            assert [editor.itemData(i) for i in range(editor.count())] == list(meta["choices"]), key
        elif hint is bool:
            assert isinstance(editor, QCheckBox), key
        elif hint in (int, float):
            assert isinstance(editor, QSpinBox if hint is int else QDoubleSpinBox), key
            if meta.get("min") is not None:
                assert editor.minimum() == meta["min"], key
            if meta.get("max") is not None:
                assert editor.maximum() == meta["max"], key
        else:
            assert isinstance(editor, QLineEdit), key


def test_form_round_trips_a_config_and_set_config_emits_nothing(qtbot):
    form = ConfigForm()
    qtbot.addWidget(form)
    config = RunConfig().with_overrides(
        [
            "lora.r=64",
            "train.lr=3e-5",
            'speed.checkpoint="offload"',
            'lora.targets="q_proj,v_proj"',
            "lora.rslora=true",
            'data.train=["a.jsonl", "b.jsonl"]',
        ]
    )
    changes = []
    form.changed.connect(lambda: changes.append(1))
    form.set_config(config)
    assert changes == [], "filling the editors from the model must not look like a user edit"
    assert form.config() == config, "fields chosen on other pages (data.train) must pass through unchanged"
    assert form.editors["train.lr"].text() == "3e-05"


def test_invalid_values_are_shown_inline_and_block_start(qtbot, window):
    page = window.page("train")
    form = page.form
    assert page.start_button.isEnabled()
    lr = form.editors["train.lr"]
    lr.lineEdit().selectAll()
    qtbot.keyClicks(lr.lineEdit(), "5")  # above the field's maximum of 1.0
    qtbot.waitUntil(lambda: form.error_text("train.lr") != "")
    assert "above its maximum 1.0" in form.error_text("train.lr")
    assert lr.property("invalid") is True
    assert not page.start_button.isEnabled()
    lr.lineEdit().selectAll()
    qtbot.keyClicks(lr.lineEdit(), "0.0001")
    qtbot.waitUntil(lambda: form.error_text("train.lr") == "")
    assert page.start_button.isEnabled()
    # a cross-field check of TrainConfig: no steps and no epochs
    form.editors["train.max_steps"].setValue(0)
    form.editors["train.epochs"].lineEdit().selectAll()
    qtbot.keyClicks(form.editors["train.epochs"].lineEdit(), "0")
    qtbot.waitUntil(lambda: form.error_text("train.max_steps") != "")
    assert "both 0" in form.error_text("train.max_steps")
    assert not page.start_button.isEnabled()
    assert any("both 0" in p for p in page.problem_list())


def test_a_valid_edit_reaches_the_shared_config_and_settings(qtbot, window, settings):
    form = window.page("train").form
    form.editors["lora.r"].setValue(48)
    assert window.state.config.lora.r == 48
    assert settings.config().lora.r == 48, "the config persists in QSettings"


def test_presets_apply_their_overrides_and_show_as_selected(qtbot, window):
    page = window.page("train")
    model_before = window.state.config.model.name_or_path
    for preset in PRESETS:
        page.preset_buttons[preset.name].click()
        for override in preset.overrides:
            key, _, raw = override.partition("=")
            section, name = key.split(".")
            expected = tomllib.loads(f"v = {raw}")["v"]
            assert getattr(getattr(window.state.config, section), name) == expected, (preset.name, override)
            assert page.form.values()[section][name] == expected, (preset.name, override)
        assert window.state.config.model.name_or_path == model_before, "a preset never changes the model"
        assert matching_preset(window.state.config) == preset.name
        assert [b.isChecked() for b in page.preset_buttons.values()] == [p is preset for p in PRESETS]
    page.form.editors["lora.r"].setValue(page.form.editors["lora.r"].value() + 1)
    assert not any(b.isChecked() for b in page.preset_buttons.values()), "an edit makes the settings custom"
    assert page.preset_note.text() == "Custom settings."


def test_moe_backend_is_disabled_for_dense_models_and_explains_auto(qtbot, window):
    page = window.page("train")
    key = "speed.moe_backend"
    combo = page.form.editors[key]
    assert [combo.itemText(i) for i in range(combo.count())][:4] == ["Auto", "grouped_mm", "Triton", "PyTorch"]
    window.state.set_model_info("dense-model", {"name": "dense-model", "is_moe": False})
    assert not combo.isEnabled() and "Dense" in page.form.note(key)
    window.state.set_model_info("moe-model", {"name": "moe-model", "is_moe": True, "num_experts": 8})
    assert combo.isEnabled() and "Auto" in page.form.note(key)
    from hone.core.events import RunStarted

    window.state.session.event.emit(
        RunStarted(
            run_dir="r",
            model="m",
            device="cuda",
            dtype="bfloat16",
            params_total=1,
            params_trainable=1,
            total_steps=1,
            tokens_per_epoch=1,
            is_moe=True,
            speed_paths={"moe": "grouped_mm (probed 3.1 ms vs triton 3.4 ms)"},
        )
    )
    assert "grouped_mm (probed" in page.form.note(key)


def test_grpo_rewards_are_edited_as_one_line_of_json(qtbot):
    from hone.core.errors import ConfigError

    form = ConfigForm()
    qtbot.addWidget(form)
    editor = form.editors["grpo.rewards"]
    editor.setText('[{"kind": "exact", "column": "answer", "weight": 2}]')
    assert form.values()["grpo"]["rewards"] == [{"kind": "exact", "column": "answer", "weight": 2}]
    form.set_config(RunConfig.from_dict(form.values(), source="the form"))
    assert json.loads(editor.text()) == [{"kind": "exact", "column": "answer", "weight": 2}]
    editor.setText("exact on answer")  # not JSON: refused with the field named
    assert "grpo.rewards" in form.errors()
    with pytest.raises(ConfigError):
        form.config()


def test_presets_keep_a_preference_run_s_method_and_set_what_it_needs(qtbot, window):
    page = window.page("train")
    window.state.update('train.method="dpo"', "preference.beta=0.5")
    for preset in PRESETS:
        page.preset_buttons[preset.name].click()
        config = window.state.config
        assert config.train.method == "dpo", "a preset never changes the training method"
        assert config.train.lr == 5e-6 and config.preference.beta == 0.1, preset.name
        assert config.lora.r == tomllib.loads(next(o for o in preset.overrides if o.startswith("lora.r=")))["lora"]["r"]
        assert matching_preset(config) == preset.name
    window.state.update('train.method="grpo"', 'grpo.rewards=[{kind = "numeric", column = "answer"}]')
    page.preset_buttons["Balanced"].click()
    assert window.state.config.train.method == "grpo" and window.state.config.train.lr == 5e-6
    assert matching_preset(window.state.config) == "Balanced"


def test_errors_follow_every_edit_and_every_new_config(qtbot):
    """errors() is answered again for the same values (a page asks several times per refresh): an edit, an edit
    undone and a new base config each give their own answer, and values() is the caller's own copy."""
    form = ConfigForm()
    qtbot.addWidget(form)
    lr = form.editors["train.lr"]
    assert form.errors() == {}
    lr.lineEdit().setText("-1")
    assert "train.lr" in form.errors()
    assert form.errors() == form.errors()
    lr.lineEdit().setText("0.0002")
    assert form.errors() == {}
    form.errors()["train.lr"] = "changed by a caller"
    assert form.errors() == {}
    form.values()["data"]["train"].append("changed_by_a_caller.jsonl")  # data.train has no editor here
    assert "changed_by_a_caller.jsonl" not in form.values()["data"]["train"]
    form.set_config(RunConfig().with_overrides(["lora.r=64"]))
    assert form.errors() == {} and form.values()["lora"]["r"] == 64


@pytest.mark.parametrize("method", ["sft", "dpo", "orpo", "simpo", "kto", "grpo"])
def test_the_matching_preset_is_the_one_whose_overrides_the_config_has(method):
    rewards = ['grpo.rewards=[{kind = "numeric", column = "answer"}]'] if method == "grpo" else []
    base = RunConfig().with_overrides([f'train.method="{method}"', *rewards])
    assert matching_preset(base) == ""
    for preset in PRESETS:
        applied = preset.apply(base)
        assert matching_preset(applied) == preset.name
        assert matching_preset(applied.with_overrides(["train.seed=7"])) == preset.name  # outside every preset
        changed = applied.with_overrides([f"lora.r={applied.lora.r * 2}"])
        assert matching_preset(changed) == "", preset.name

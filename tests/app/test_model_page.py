"""Model page: a model that cannot be read never becomes the run's model, errors name fields as the form labels them,
and the tiles show what an earlier inspection found as soon as the window opens."""

from __future__ import annotations

import json

from hone.app.model_names import model_name
from hone.app.state import _key
from hone.app.widgets.common import human_count


def test_a_model_that_cannot_be_read_keeps_the_previous_one(qtbot, make_window, tmp_path):
    window = make_window()
    page = window.page("model")
    before = window.state.config.model.name_or_path
    missing = tmp_path / "no-such-model"
    with qtbot.waitSignal(page.inspected, timeout=60_000):
        page.choose(str(missing))
    assert window.state.config.model.name_or_path == before, "the run keeps the model it had"
    assert window.settings.config().model.name_or_path == before, "and so do the saved settings"
    assert str(missing) not in window.settings.recent_models()
    text = page.status.text()
    assert "no-such-model" in text and f"still uses {model_name(before)}" in text  # its name, not its bundled: id
    assert "model.name_or_path" not in text and "“Model”" in text, text
    assert page.status.property("role") == "error"


def test_tiles_show_the_cached_model_at_start(make_window, settings):
    info = {
        "name": "Org/Some-Model-1B",
        "params": 1_234_000_000,
        "source_kind": "hub",
        "is_moe": True,
        "num_experts": 8,
        "experts_per_token": 2,
        "is_vision": False,
        "layers": 16,
        "hidden_size": 2048,
        "vocab_size": 32000,
        "context_length": 4096,
        "architecture": "X",
        "model_type": "x",
    }
    config = settings.config()
    config.model.name_or_path = info["name"]
    settings.set_config(config)
    settings.set_value(f"model/info/{_key(info['name'])}", json.dumps(info))
    page = make_window().page("model")
    assert page.params_tile.value() == human_count(1_234_000_000) == "1.2B"
    assert page.kind_tile.value() == "MoE" and "8 experts" in page.kind_tile.detail()
    assert page.details.value("Layers") == "16"


def test_changing_the_model_elsewhere_brings_its_own_details(make_window, settings):
    settings.set_value(f"model/info/{_key('Org/A')}", json.dumps({"name": "Org/A", "params": 5_000_000}))
    window = make_window()
    window.state.update('model.name_or_path="Org/A"')
    assert window.page("model").params_tile.value() == "5.0M"
    window.state.update('model.name_or_path="Org/Never-Read"')
    assert window.state.model_info is None, "no details of the model it replaced"
    assert window.page("model").params_tile.value() == "—"


def test_an_moe_model_shows_its_family_row_and_a_dense_one_hides_it(make_window, settings):
    """The family table's row (router, attention, what stays on transformers' path) for GLM-4.7-Flash; an MoE
    family without a row says so; a dense model shows no family card."""
    info = {
        "name": "zai-org/GLM-4.7-Flash",
        "params": 30_000_000_000,
        "source_kind": "hub",
        "is_moe": True,
        "num_experts": 64,
        "experts_per_token": 4,
        "model_type": "glm4_moe_lite",
    }
    window = make_window()
    page = window.page("model")
    page._show_info(info)
    assert not page.family_card.isHidden()
    text = page.family_text.text()
    assert text.startswith("GLM-4.7-Flash") and "MLA" in text and "correction bias" in text
    assert "GGUF export: not for MoE models yet" in text
    page._show_info(dict(info, model_type="some_new_moe"))
    assert "some_new_moe: a family without a row" in page.family_text.text()
    page._show_info(dict(info, is_moe=False, model_type="qwen3"))
    assert page.family_card.isHidden()

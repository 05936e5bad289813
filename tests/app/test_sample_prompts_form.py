"""The Train form's box for train.sample_prompts: JSON (a list of prompts, or a number of evaluation rows), or plain
text taken as one prompt; what it shows of a config is what the config holds."""

from __future__ import annotations

import pytest

from hone.app.widgets.config_form import ConfigForm
from hone.core.config import RunConfig
from hone.core.errors import ConfigError


def test_the_sample_prompts_box_reads_lists_numbers_and_plain_text(qtbot):
    form = ConfigForm()
    qtbot.addWidget(form)
    form.set_config(
        RunConfig().with_overrides(['train.sample_prompts=["What is 2 + 2?", "Hi"]', "data.eval_fraction=0.1"])
    )
    box = form.editors["train.sample_prompts"]
    assert box.text() == '["What is 2 + 2?", "Hi"]' and "JSON, e.g." in box.placeholderText()
    assert "train.sample_prompts" in box.toolTip()
    box.setText("3")
    assert form.config().train.sample_prompts == 3
    box.setText("Name a colour, then a fruit.")  # not JSON: one prompt, commas and all
    assert form.config().train.sample_prompts == ["Name a colour, then a fruit."]
    box.setText("")
    assert form.config().train.sample_prompts == []
    box.setText("[1, 2]")
    with pytest.raises(ConfigError, match="neither a list of prompts nor a number"):
        form.config()
    assert "train.sample_prompts" in form.errors()

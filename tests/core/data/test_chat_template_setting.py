"""`data.chat_template`: the model's own template, ChatML for a model without one (said on the first lines), chatml
by name, or a Jinja file; a missing or broken file is an error naming the setting before anything loads; a run
trains with the chosen template and its adapter keeps it."""

from __future__ import annotations

import copy
import json

import pytest

from hone.core.config import RunConfig
from hone.core.data.template import FALLBACK_TEMPLATE, ChatTemplate, apply_template_setting, template_setting_source
from hone.core.errors import DataError
from hone.core.train.input_checks import check_inputs

MARKED = (
    "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant: {% endif %}"
)


def test_the_setting_names_a_template_or_a_file(tmp_path):
    assert template_setting_source("") is None
    assert template_setting_source("chatml") == FALLBACK_TEMPLATE
    path = tmp_path / "t.jinja"
    path.write_text(MARKED, encoding="utf-8")
    assert template_setting_source(str(path)) == MARKED
    with pytest.raises(DataError, match=r"data\.chat_template: cannot read"):
        template_setting_source(str(tmp_path / "missing.jinja"))
    (tmp_path / "latin1.jinja").write_bytes(b"\xe9\xff")
    with pytest.raises(DataError, match=r"data\.chat_template"):
        template_setting_source(str(tmp_path / "latin1.jinja"))


def test_a_model_keeps_its_own_template_and_one_without_gets_chatml(smollm2_tokenizer):
    own = copy.deepcopy(smollm2_tokenizer)
    before = own.chat_template
    assert apply_template_setting(own, "") is None and own.chat_template == before

    base = copy.deepcopy(smollm2_tokenizer)
    base.chat_template = None
    said = apply_template_setting(base, "")
    assert said.startswith("chat template: ChatML (the model has no chat template")
    assert base.chat_template == FALLBACK_TEMPLATE
    assert not ChatTemplate.for_tokenizer(base).is_fallback  # the data, chat and the adapter all see it now


def test_a_file_template_is_what_the_rows_are_rendered_with(smollm2_tokenizer, tmp_path):
    path = tmp_path / "marked.jinja"
    path.write_text(MARKED, encoding="utf-8")
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    assert apply_template_setting(tokenizer, str(path)) == f"chat template: from {path}"
    text, spans = ChatTemplate.for_tokenizer(tokenizer).render_with_spans(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    )
    assert text.startswith("### user: hi") and text[spans[0][0] : spans[0][1]].startswith("hello")

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}", encoding="utf-8")
    with pytest.raises(DataError, match="not a valid Jinja template"):
        apply_template_setting(copy.deepcopy(smollm2_tokenizer), str(broken))


def test_a_missing_template_file_stops_the_run_before_anything_loads(tmp_path):
    config = RunConfig().with_overrides([f"data.chat_template={json.dumps(str(tmp_path / 'nope.jinja'))}"])
    with pytest.raises(DataError, match=r"data\.chat_template: no file"):
        check_inputs(config)


def test_a_run_trains_with_the_chosen_template_and_its_adapter_keeps_it(
    tiny_model_dir, chat_files, tiny_config, tmp_path
):
    from hone.core import events
    from hone.core.train.trainer import Trainer

    path = tmp_path / "marked.jinja"
    path.write_text(MARKED, encoding="utf-8")
    runs = tmp_path / "runs"
    config = tiny_config(
        tiny_model_dir("tiny-dense"),
        chat_files,
        runs,
        "train.max_steps=1",
        f"data.chat_template={json.dumps(str(path))}",
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    assert any(isinstance(e, events.Notice) and e.message == f"chat template: from {path}" for e in seen)
    saved = json.loads((next(runs.iterdir()) / "adapter" / "tokenizer_config.json").read_text())
    template = saved.get("chat_template") or (next(runs.iterdir()) / "adapter" / "chat_template.jinja").read_text()
    assert template == MARKED

"""Learning a chat template's per-message wrappers by rendering it, and rewriting it as an Ollama Go template.

The reference for every rendering is transformers' own Jinja rendering of the original template."""

from __future__ import annotations

import pytest
from export_helpers import LLAMA2, LLAMA3, NO_SYSTEM, ZEPHYR

from hone.core.export.chat_layout import NotPerMessage, infer_layout, verify_layout
from hone.core.export.formats import ExportError
from hone.core.export.go_template import render
from hone.core.export.ollama import go_template


@pytest.fixture
def tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def ollama_render(layout, template):
    def run(messages):
        if layout.default_system is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": layout.default_system}, *messages]
        return layout.bos + render(
            template, {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages]}
        )

    return run


def test_chatml_with_a_default_system_prompt(tokenizer):
    layout = infer_layout(tokenizer)
    assert layout.bos == ""
    assert layout.wrap == {
        "system": ("<|im_start|>system\n", "<|im_end|>\n"),
        "user": ("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
    }
    assert layout.generation_prompt == "<|im_start|>assistant\n"
    assert layout.default_system == "You are a helpful assistant."
    assert layout.turn_end == "<|im_end|>"
    assert verify_layout(layout, tokenizer) == []
    assert verify_layout(layout, tokenizer, ollama_render(layout, go_template(layout))) == []


@pytest.mark.parametrize(
    "template, bos, user, generation",
    [
        (
            LLAMA3,
            "<|im_start|>",
            ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (ZEPHYR, "", ("<|user|>\n", "<|im_end|>\n"), "<|assistant|>\n"),
    ],
)
def test_other_per_message_templates(tokenizer, template, bos, user, generation):
    tokenizer.chat_template = template
    layout = infer_layout(tokenizer)
    assert (layout.bos, layout.wrap["user"], layout.generation_prompt, layout.default_system) == (
        bos,
        user,
        generation,
        None,
    )
    assert verify_layout(layout, tokenizer, ollama_render(layout, go_template(layout))) == []


def test_a_wrong_rewrite_is_caught(tokenizer):
    """verify_layout compares against the real template: a Go template missing the newline after a turn fails."""
    layout = infer_layout(tokenizer)
    broken = go_template(layout).replace("<|im_end|>\n{{ else if", "<|im_end|>{{ else if", 1)
    assert verify_layout(layout, tokenizer, ollama_render(layout, broken))


@pytest.mark.parametrize(
    "template, words",
    [
        (LLAMA2, "each message|depends on more than their roles"),
        (NO_SYSTEM, "System role not supported"),
    ],
)
def test_templates_that_are_not_per_message_are_refused(tokenizer, template, words):
    tokenizer.chat_template = template
    with pytest.raises(NotPerMessage, match=words):
        infer_layout(tokenizer)


def test_no_template(tokenizer):
    tokenizer.chat_template = None
    with pytest.raises(ExportError, match="no chat template"):
        infer_layout(tokenizer)

"""Label masks on real chat templates: every trained token lies inside an assistant turn, and every token of an
assistant turn's content and end-of-turn marker is trained.

The expected spans come from a regular expression over the rendered text (independent of the prefix rendering
the code uses), and token positions from decoding each token on its own (independent of offset mappings).
Templates: SmolLM2's ChatML (from its GGUF), a Llama-3 style and a Gemma style (written in conftest.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from data_helpers import chat, write_jsonl

from hone.core.config import DataConfig
from hone.core.data import IGNORE_INDEX, load_training_data
from hone.core.data.template import ChatTemplate

# Per template: the regex whose group 1 is what an assistant turn trains (content + end-of-turn marker).
ASSISTANT_RE = {
    "chatml": re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S),
    "llama3": re.compile(r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)", re.S),
    "gemma": re.compile(r"<start_of_turn>model\n(.*?<end_of_turn>)", re.S),
}

CONVERSATIONS = [
    chat("What is the capital of France?", "Paris."),
    chat("Hi", "Hello! How can I help?", "What is 2+2?", "It is 4.", system="You are terse."),
    chat("Name three colors.", "  Red, green and blue.  ", "Another?", "Purple.\nAlso teal."),
    chat("Write JSON", '{"a": [1, 2], "b": "<tag>"}', system="Answer in JSON only."),
]


@pytest.fixture(params=["chatml", "llama3", "gemma"])
def template_case(request, smollm2_tokenizer, llama3_tokenizer, gemma_tokenizer):
    tokenizers = {"chatml": smollm2_tokenizer, "llama3": llama3_tokenizer, "gemma": gemma_tokenizer}
    return request.param, tokenizers[request.param]


def _token_starts(tokenizer, ids: list[int]) -> tuple[str, np.ndarray]:
    pieces = [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    return "".join(pieces), starts


def test_trained_tokens_are_exactly_the_assistant_turns(tmp_path, template_case):
    name, tokenizer = template_case
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    data = load_training_data(DataConfig(train=[str(path)], max_length=512), tokenizer, cache_dir=tmp_path / "c")
    assert len(data.train) == len(CONVERSATIONS)
    for k, row in enumerate(data.train):
        assert row.source == f"{path}:{k + 1}"
        rendered = tokenizer.apply_chat_template(CONVERSATIONS[k]["messages"], tokenize=False)
        text, starts = _token_starts(tokenizer, row.input_ids)
        assert text == rendered, f"{name} row {k}: tokens do not decode to the template's rendering"
        expected = np.zeros(len(row.input_ids), dtype=bool)
        turns = list(ASSISTANT_RE[name].finditer(rendered))
        assert len(turns) == sum(m["role"] == "assistant" for m in CONVERSATIONS[k]["messages"])
        for match in turns:
            expected |= (starts >= match.start(1)) & (starts < match.end(1))
        trained = np.array(row.labels) != IGNORE_INDEX
        wrong = np.flatnonzero(trained != expected)
        assert not len(wrong), (
            f"{name} row {k}: tokens {wrong.tolist()} disagree; trained text "
            f"{tokenizer.decode(np.array(row.input_ids)[trained])!r}"
        )
        assert np.array_equal(np.array(row.labels)[trained], np.array(row.input_ids)[trained])


def test_token_ids_match_apply_chat_template(tmp_path, template_case):
    name, tokenizer = template_case
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    data = load_training_data(DataConfig(train=[str(path)], max_length=512), tokenizer, cache_dir=tmp_path / "c")
    for k, row in enumerate(data.train):
        reference = tokenizer.apply_chat_template(CONVERSATIONS[k]["messages"], tokenize=True)
        reference = reference["input_ids"] if hasattr(reference, "keys") else reference
        assert row.input_ids == list(reference), f"{name} row {k}"


def test_train_on_all_trains_every_token(tmp_path, smollm2_tokenizer):
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS[:2])
    data = load_training_data(
        DataConfig(train=[str(path)], train_on="all"), smollm2_tokenizer, cache_dir=tmp_path / "c"
    )
    for row in data.train:
        assert row.labels == row.input_ids
    assert data.train.num_trained == data.train.num_tokens


def test_template_rendering_matches_transformers_including_generation_prompt(template_case):
    name, tokenizer = template_case
    template = ChatTemplate.for_tokenizer(tokenizer)
    for conversation in CONVERSATIONS:
        messages = conversation["messages"]
        assert template.render(messages) == tokenizer.apply_chat_template(messages, tokenize=False)
        head = messages[:-1]
        assert template.render(head, add_generation_prompt=True) == tokenizer.apply_chat_template(
            head, tokenize=False, add_generation_prompt=True
        ), name


def test_template_that_rewrites_earlier_turns_still_finds_them(smollm2_tokenizer):
    """A template that renders the last assistant turn differently (as reasoning templates do) breaks the prefix
    property; the fallback still trains exactly the content and end marker of each turn."""
    source = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and loop.last %}"
        "{{ '<|im_start|>assistant\n[final] ' + m['content'] + '<|im_end|>\n' }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    template = ChatTemplate(source=source, variables={})
    messages = chat("a", "first answer", "b", "second answer")["messages"]
    text, spans = template.render_with_spans(messages)
    trained = [text[s:e] for s, e in spans]
    assert trained == ["first answer<|im_end|>", "[final] second answer<|im_end|>"]

"""Streaming chat: our token loop reproduces transformers' generate, base and tuned side by side share weights."""

from __future__ import annotations

import threading

import pytest

from hone.core.inference.chat import BASE, TUNED, ChatModels, GenerationSettings, stream_reply, stream_side_by_side

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def base_and_peft(tiny_model_dir):
    """A tiny Qwen3 with the SmolLM2 tokenizer, and the same model with a LoRA adapter whose B is random
    (so the adapter really changes the logits)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_model_dir("tiny-dense")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(0)
    tuned = get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=64, target_modules="all-linear", init_lora_weights=False),
    ).eval()
    return base, tuned, tokenizer


def _reference(model, tokenizer, max_new_tokens, stop_ids):
    """transformers' own greedy generate, decoded: the independent reference."""
    import torch

    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(stop_ids),
            pad_token_id=tokenizer.eos_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _stop_ids(model, tokenizer):
    from hone.core.inference.chat import _stop_token_ids

    return _stop_token_ids(model, tokenizer)


def test_greedy_stream_equals_transformers_generate(base_and_peft):
    base, _, tokenizer = base_and_peft
    settings = GenerationSettings(max_new_tokens=24)
    pieces = list(stream_reply(base, tokenizer, MESSAGES, settings))
    assert len(pieces) > 1, "the reply should arrive in several pieces"
    assert "".join(pieces) == _reference(base, tokenizer, 24, _stop_ids(base, tokenizer))


def test_side_by_side_equals_each_model_alone_and_they_differ(base_and_peft):
    base, tuned, tokenizer = base_and_peft
    settings = GenerationSettings(max_new_tokens=16)
    replies = {BASE: "", TUNED: ""}
    order = []
    for side, piece in stream_side_by_side(tuned, tokenizer, MESSAGES, settings):
        replies[side] += piece
        order.append(side)
    stop_ids = _stop_ids(base, tokenizer)
    assert replies[BASE] == _reference(base, tokenizer, 16, stop_ids)  # adapter off == the plain base model
    assert replies[TUNED] == _reference(tuned, tokenizer, 16, stop_ids)
    assert replies[BASE] != replies[TUNED]
    assert BASE in order[:3] and TUNED in order[:3], f"the two replies should interleave, got {order[:6]}"


def test_chat_models_base_only_streams_the_base(base_and_peft):
    base, _, tokenizer = base_and_peft
    chat = ChatModels(base, tokenizer, has_adapter=False)
    sides = {side for side, _ in chat.stream_both(MESSAGES, GenerationSettings(max_new_tokens=4))}
    assert sides == {BASE}


def test_stop_flag_ends_the_stream_early(base_and_peft):
    _, tuned, tokenizer = base_and_peft
    stop = threading.Event()
    chat = ChatModels(tuned, tokenizer, has_adapter=True)
    got = []
    for piece in chat.stream(MESSAGES, GenerationSettings(max_new_tokens=50), stop=stop):
        got.append(piece)
        if len(got) == 3:
            stop.set()
    assert len(got) == 3


def test_sampling_is_seeded(base_and_peft):
    base, _, tokenizer = base_and_peft
    settings = GenerationSettings(max_new_tokens=12, temperature=1.5, top_p=0.9, seed=7)
    first = "".join(stream_reply(base, tokenizer, MESSAGES, settings))
    second = "".join(stream_reply(base, tokenizer, MESSAGES, settings))
    greedy = "".join(stream_reply(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=12)))
    assert first == second
    assert first != greedy


def test_bad_settings_are_rejected_with_advice():
    from hone.core.errors import ConfigError

    with pytest.raises(ConfigError, match="temperature"):
        GenerationSettings(temperature=-1)


def test_tuned_side_can_continue_its_own_conversation(base_and_peft):
    _, tuned, tokenizer = base_and_peft
    settings = GenerationSettings(max_new_tokens=8)
    tuned_history = [*MESSAGES, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "More?"}]
    got = {BASE: "", TUNED: ""}
    for side, piece in stream_side_by_side(tuned, tokenizer, MESSAGES, settings, tuned_messages=tuned_history):
        got[side] += piece
    alone = "".join(stream_reply(tuned, tokenizer, tuned_history, settings, adapter_enabled=True))
    assert got[TUNED] == alone
    assert got[BASE] == "".join(stream_reply(tuned, tokenizer, MESSAGES, settings, adapter_enabled=False))


def test_a_chat_template_over_its_limits_ends_the_reply_in_seconds_with_what_to_do(base_and_peft):
    """A template from the Hub that loops for hours renders under the same limits as in training."""
    import copy
    import time

    from hone.core.errors import HoneError

    base, _, tokenizer = base_and_peft
    hostile = copy.copy(tokenizer)
    hostile.chat_template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(HoneError) as refused:
        next(stream_reply(base, hostile, MESSAGES, GenerationSettings(max_new_tokens=2)))
    assert time.monotonic() - started < 5
    assert refused.value.message.startswith("the chat template took over 1 s to render"), refused.value.message
    assert "a template file you trust" in refused.value.advice


def _reference_with(model, tokenizer, messages, max_new_tokens, **generate_kwargs):
    """transformers' greedy generate on `messages` with extra generate() arguments, decoded (the reference)."""
    import torch

    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(_stop_ids(model, tokenizer)),
            pad_token_id=tokenizer.eos_token_id,
            **generate_kwargs,
        )
    return out[0, ids.shape[1] :].tolist()


def _token_ids(model, tokenizer, messages, settings):
    from hone.core.inference.chat import Generation

    generation = Generation(model, tokenizer, messages, settings)
    while not generation.done:
        generation.step()
    return generation.token_ids


def test_repetition_penalty_changes_the_chosen_tokens_as_transformers_does(base_and_peft):
    """The penalty divides positive / multiplies negative logits of every token already in prompt + reply: the
    tokens equal transformers' RepetitionPenaltyLogitsProcessor's, differ from the unpenalized reply, and 1.0 is
    off."""
    base, _, tokenizer = base_and_peft
    plain = _token_ids(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=24))
    off = _token_ids(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=24, repetition_penalty=1.0))
    penalized = _token_ids(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=24, repetition_penalty=1.5))
    again = _token_ids(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=24, repetition_penalty=1.5))
    assert off == plain
    assert penalized == again, "greedy with a penalty is deterministic"
    assert penalized != plain, "the penalty should change the chosen tokens"
    want = _reference_with(base, tokenizer, MESSAGES, 24, repetition_penalty=1.5)
    assert penalized == [t for t in want if t not in _stop_ids(base, tokenizer)]
    assert len(set(penalized)) > len(set(plain)), "fewer repeats with the penalty"


@pytest.mark.parametrize("value", [0.0, 0.5, 2.5, float("nan")])
def test_a_repetition_penalty_out_of_range_names_the_field(value):
    from hone.core.errors import ConfigError

    with pytest.raises(ConfigError, match="repetition_penalty") as refused:
        GenerationSettings(repetition_penalty=value)
    assert "1.0" in refused.value.advice


def test_the_system_prompt_goes_in_as_a_system_message(base_and_peft):
    base, _, tokenizer = base_and_peft
    system = "You answer in French."
    messages = [{"role": "system", "content": system}, *MESSAGES]
    got = _token_ids(base, tokenizer, MESSAGES, GenerationSettings(max_new_tokens=12, system_prompt=system))
    want = _reference_with(base, tokenizer, messages, 12)
    assert got == [t for t in want if t not in _stop_ids(base, tokenizer)]
    # the prompt is the template's render of [system, user]: as many tokens as transformers' own render
    from hone.core.inference.chat import Generation

    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert system in rendered
    with_system = Generation(base, tokenizer, MESSAGES, GenerationSettings(system_prompt=system))
    without = Generation(base, tokenizer, MESSAGES, GenerationSettings())
    assert with_system.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert with_system.prompt_tokens != without.prompt_tokens
    assert ChatModels(base, tokenizer, has_adapter=False).system_prompt_refusal() == ""


NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_without_a_system_role_is_said_in_words_not_a_crash(base_and_peft):
    import copy

    from hone.core.errors import HoneError

    base, _, tokenizer = base_and_peft
    strict = copy.copy(tokenizer)
    strict.chat_template = NO_SYSTEM_TEMPLATE
    chat = ChatModels(base, strict, has_adapter=False)
    refusal = chat.system_prompt_refusal()
    assert "system" in refusal and "System role not supported" in refusal
    # without a system prompt the same template chats as before
    assert "".join(chat.stream(MESSAGES, GenerationSettings(max_new_tokens=3)))
    with pytest.raises(HoneError, match="system") as refused:
        list(chat.stream(MESSAGES, GenerationSettings(max_new_tokens=3, system_prompt="Be brief.")))
    assert "system prompt" in refused.value.advice

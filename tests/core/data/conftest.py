"""Fixtures for the dataset tests: an isolated Hone cache, file writers, and chat tokenizers with three real
template styles built offline on top of the SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

# Llama-3 Instruct style, written here after the published prompt format: a BOS, then per message
# "<|start_header_id|>role<|end_header_id|>\n\n" + trimmed content + "<|eot_id|>".
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Gemma instruct style, written here after the published prompt format: BOS, the system prompt folded into the
# first user turn, roles user/model that must alternate (the template raises otherwise), turns wrapped in
# "<start_of_turn>role\n" ... "<end_of_turn>\n".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_TOKENS = ["<bos>", "<start_of_turn>", "<end_of_turn>"]


@pytest.fixture(autouse=True)
def hone_cache(tmp_path, monkeypatch):
    """Every test gets its own cache root, so nothing is read from or written to the user's cache."""
    root = tmp_path / "hone-cache"
    monkeypatch.setenv("HONE_CACHE", str(root))
    return root / "datasets"


@pytest.fixture(scope="session")
def llama3_tokenizer(smollm2_tokenizer_dir):
    """SmolLM2's vocabulary with Llama-3's special tokens and a Llama-3 style chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "additional_special_tokens": LLAMA3_TOKENS[1:3]}
    )
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def gemma_tokenizer(smollm2_tokenizer_dir):
    """SmolLM2's vocabulary with Gemma's special tokens and a Gemma style chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": GEMMA_TOKENS[1:]})
    tok.chat_template = GEMMA_TEMPLATE
    return tok


# A LLaVA-style template written here: typed content parts, an "<image>" token where each image part goes.
VISION_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}{{ '<image>' }}{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def llava_processor(smollm2_tokenizer_dir):
    """A real transformers LlavaProcessor (CLIP image processor, 56 px crops, 14 px patches: 15 image tokens
    per image) over the SmolLM2 tokenizer with an added "<image>" token."""
    from transformers import AutoTokenizer, LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # older transformers name the Pillow processor plainly
        from transformers import CLIPImageProcessor as ImageProcessor

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    images = ImageProcessor(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56})
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        chat_template=VISION_TEMPLATE,
    )

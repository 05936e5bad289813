"""Tokenizer metadata for GGUF: token list and types, padding, merges, special ids, and the pre-tokenizer id."""

from __future__ import annotations

import pytest

from hone.core.export.formats import ExportError
from hone.core.export.gguf_vocab import LLAMA3_SPLIT, QWEN2_SPLIT, build_vocab, detect_pre


def tokenizer_with(pre_tokenizer=None, model=None, added=("<|im_start|>", "<|im_end|>"), bos=None):
    """A small fast tokenizer: byte-level BPE over a few words unless `model` says otherwise."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(model or models.BPE())
    backend.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    if model is None:
        trainer = trainers.BpeTrainer(
            vocab_size=280,
            special_tokens=list(added),
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        backend.train_from_iterator(["hello world", "hello there world"] * 5, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=added[-1], bos_token=bos)
    tokenizer.add_tokens(["<think>"])  # a user-defined (not special) added token
    return tokenizer


def test_tokens_types_merges_and_padding():
    tokenizer = tokenizer_with()
    size = len(tokenizer)
    vocab = build_vocab(tokenizer, vocab_size=size + 5, eot_text="<|im_end|>")
    assert len(vocab.tokens) == len(vocab.token_types) == size + 5
    assert vocab.tokens[:2] == ["<|im_start|>", "<|im_end|>"] and vocab.token_types[:2] == [3, 3]  # control
    think = tokenizer.convert_tokens_to_ids("<think>")
    assert vocab.tokens[think] == "<think>" and vocab.token_types[think] == 4  # user-defined
    assert vocab.tokens[size:] == [f"[PAD{i}]" for i in range(size, size + 5)] and set(vocab.token_types[size:]) == {5}
    hello = tokenizer.convert_tokens_to_ids("hello")
    assert vocab.tokens[hello] == "hello" and vocab.token_types[hello] == 1
    assert all(len(m.split(" ")) == 2 for m in vocab.merges)
    assert any(m.replace(" ", "") == "hello" for m in vocab.merges), "no merge builds the token 'hello'"
    assert vocab.eos_id == 1 and vocab.eot_id == 1 and vocab.bos_id is None and not vocab.add_bos
    assert vocab.pre == "gpt-2"


def test_bos_flag_follows_what_the_tokenizer_does():
    from tokenizers import processors

    tokenizer = tokenizer_with(bos="<|im_start|>")
    assert not build_vocab(tokenizer, len(tokenizer)).add_bos
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", 0)]
    )
    assert build_vocab(tokenizer, len(tokenizer)).add_bos
    assert build_vocab(tokenizer_with(bos="<|im_start|>"), 300, bos_in_template=True).add_bos


@pytest.mark.parametrize("regex, expected", [(LLAMA3_SPLIT, "llama-bpe"), (QWEN2_SPLIT, "qwen2")])
def test_split_regex_pre_tokenizers(regex, expected):
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    assert build_vocab(tokenizer_with(pre), 300).pre == expected


def test_smollm_pre_tokenizer():
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    assert build_vocab(tokenizer_with(pre), 300).pre == "smollm"


def test_unknown_pre_tokenizer_is_refused_not_guessed():
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\w+|\s+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    with pytest.raises(ExportError, match="pre-tokenizer") as e:
        build_vocab(tokenizer_with(pre), 300)
    assert "llama-bpe" in e.value.advice and "qwen2" in e.value.advice
    assert detect_pre({"pre_tokenizer": {"type": "Whitespace"}}) is None


def test_non_bpe_tokenizer_is_refused():
    from tokenizers import models

    tokenizer = tokenizer_with(model=models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"), added=("[UNK]",))
    with pytest.raises(ExportError, match="WordLevel") as e:
        build_vocab(tokenizer, 300)
    assert "sentencepiece" in e.value.advice


def test_tokenizer_larger_than_the_model_is_refused():
    tokenizer = tokenizer_with()
    with pytest.raises(ExportError, match="embedding rows"):
        build_vocab(tokenizer, len(tokenizer) - 1)

"""The tokenizer as GGUF metadata: llama.cpp's "gpt2" (byte-level BPE) vocabulary, merges, token types, special
token ids, add-BOS flag and chat template.

llama.cpp names the pre-tokenizer (the regex that splits text before BPE) by a short id. Hone reads it from the
tokenizer itself: the split regex (Llama 3, Qwen2), digit splitting plus byte-level (SmolLM), or byte-level alone
(GPT-2). When the base model was itself a GGUF with the same vocabulary, its id is kept. Anything else is refused
rather than written with a guessed id, because a wrong id tokenizes text silently differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.export.formats import ExportError

# Token kinds as llama.cpp numbers them (gguf.TokenType).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# Split regexes of the byte-level tokenizers llama.cpp knows, as their tokenizer.json files write them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_PRE_TOKENIZERS = {LLAMA3_SPLIT: "llama-bpe", QWEN2_SPLIT: "qwen2"}
SUPPORTED_TOKENIZERS = (
    "byte-level BPE tokenizers: Llama 3 (llama-bpe), Qwen2/2.5/3 (qwen2), SmolLM (smollm) and GPT-2 style (gpt-2)"
)


@dataclass
class Vocab:
    """Everything llama.cpp reads about the tokenizer."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    chat_template: str | None
    eot_id: int | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> dict[str, tuple[Any, Any]]:
        """{key: (value, GGUFValueType)} for the writer; arrays carry their element type as a third item."""
        from gguf import GGUFValueType as T

        meta: dict[str, tuple] = {
            "tokenizer.ggml.model": ("gpt2", T.STRING),
            "tokenizer.ggml.pre": (self.pre, T.STRING),
            "tokenizer.ggml.tokens": (self.tokens, T.ARRAY, T.STRING),
            "tokenizer.ggml.token_type": (self.token_types, T.ARRAY, T.INT32),
            "tokenizer.ggml.add_bos_token": (self.add_bos, T.BOOL),
            "tokenizer.ggml.add_eos_token": (False, T.BOOL),
        }
        if self.merges:  # a GGUF array may not be empty
            meta["tokenizer.ggml.merges"] = (self.merges, T.ARRAY, T.STRING)
        for key, value in (
            ("bos", self.bos_id),
            ("eos", self.eos_id),
            ("padding", self.pad_id),
            ("unknown", self.unk_id),
            ("eot", self.eot_id),
        ):
            if value is not None:
                meta[f"tokenizer.ggml.{key}_token_id"] = (int(value), T.UINT32)
        if self.chat_template:
            meta["tokenizer.chat_template"] = (self.chat_template, T.STRING)
        return meta


def _backend(tokenizer) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError(
            f"GGUF export needs a fast (tokenizers) tokenizer; this one is {type(tokenizer).__name__}",
            f"Hone writes {SUPPORTED_TOKENIZERS}",
        )
    return json.loads(backend.to_str())


def _is_byte_level(node: dict | None) -> bool:
    if not node:
        return False
    if node.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(n) for n in node.get("pretokenizers", []) + node.get("decoders", []))


def detect_pre(tokenizer_json: dict) -> str | None:
    """llama.cpp's pre-tokenizer id for a byte-level tokenizer.json, or None when it is not one Hone knows."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = parts[0].get("pattern", {})
        return SPLIT_PRE_TOKENIZERS.get(pattern.get("Regex", pattern.get("String")))
    return None


def _base_gguf_pre(base_gguf: Path | None, tokens: list[str]) -> str | None:
    """The pre-tokenizer id a base GGUF states, when its vocabulary is the same as ours."""
    if base_gguf is None:
        return None
    from hone.core.models.gguf_read import read_gguf

    meta = read_gguf(base_gguf, {"tokenizer.ggml.pre", "tokenizer.ggml.tokens"}).metadata
    theirs = meta.get("tokenizer.ggml.tokens")
    if not meta.get("tokenizer.ggml.pre") or not theirs:
        return None
    return meta["tokenizer.ggml.pre"] if theirs == tokens[: len(theirs)] else None


def build_vocab(
    tokenizer,
    vocab_size: int,
    *,
    eot_text: str | None = None,
    bos_in_template: bool = False,
    base_gguf: Path | None = None,
) -> Vocab:
    """Read the GGUF tokenizer metadata out of a transformers tokenizer.

    Args:
        tokenizer: a fast transformers tokenizer with a byte-level BPE model.
        vocab_size: the model's embedding rows; the token list is padded with unused `[PADn]` entries up to it.
        eot_text: the token that ends an assistant turn in the chat template (e.g. "<|im_end|>"), if known.
        bos_in_template: the chat template writes the BOS token itself; llama.cpp must then add it (and the
            Ollama template leaves it out).
        base_gguf: the base model's GGUF file, if it was one (its pre-tokenizer id is reused).

    Raises:
        ExportError: the tokenizer is not a byte-level BPE Hone can describe, or is larger than the model.
    """
    data = _backend(tokenizer)
    model = data.get("model", {})
    if model.get("type") != "BPE" or not (
        _is_byte_level(data.get("pre_tokenizer")) or _is_byte_level(data.get("decoder"))
    ):
        raise ExportError(
            f"GGUF export does not handle this tokenizer ({model.get('type')} model)",
            f"Hone writes {SUPPORTED_TOKENIZERS}; sentencepiece tokenizers (Llama 2, Mistral v0.1-0.3, "
            "Gemma) are not supported yet",
        )
    size = len(tokenizer)
    if size > vocab_size:
        raise ExportError(
            f"the tokenizer has {size} tokens but the model only {vocab_size} embedding rows",
            "the tokenizer does not belong to this model; check the run's adapter folder",
        )
    backend = tokenizer.backend_tokenizer
    added = {index: token for index, token in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for index in range(vocab_size):
        token = backend.id_to_token(index) if index < size else None
        if token is None:
            tokens.append(f"[PAD{index}]")
            types.append(UNUSED)
        elif index in added:
            tokens.append(added[index].content)
            types.append(CONTROL if added[index].special else USER_DEFINED)
        else:
            tokens.append(token)
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    notes = {}
    pre = _base_gguf_pre(base_gguf, tokens)
    if pre:
        notes["pre_tokenizer"] = f"{pre} (from the base GGUF)"
    else:
        pre = detect_pre(data)
        if pre is None:
            raise ExportError(
                "GGUF export does not recognise this tokenizer's pre-tokenizer "
                f"({json.dumps(data.get('pre_tokenizer'))[:120]})",
                f"Hone writes {SUPPORTED_TOKENIZERS}",
            )
        notes["pre_tokenizer"] = pre
    probe = tokenizer("a")["input_ids"]
    bos_id = tokenizer.bos_token_id
    add_bos = bos_in_template or (bos_id is not None and bool(probe) and probe[0] == bos_id)
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    eot_id = tokenizer.convert_tokens_to_ids(eot_text) if eot_text else None
    return Vocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        pre=pre,
        bos_id=bos_id,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        unk_id=tokenizer.unk_token_id,
        add_bos=add_bos,
        chat_template=template,
        eot_id=eot_id,
        notes=notes,
    )

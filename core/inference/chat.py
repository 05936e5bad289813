"""Streaming chat with a base model and its fine-tuned adapter, side by side.

Plain generators of text pieces, no Qt: the Studio's Chat page runs them in a worker thread and the CLI could
print them. Decoding is an explicit loop (prompt -> forward with a KV cache -> pick a token -> decode the new
text), so the base and the fine-tuned reply can advance one token each in turn while sharing one copy of the
base weights (the adapter is switched off for the base's steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hone.core.data.template import render_conversation

BASE = "base"
TUNED = "tuned"

# A piece that ends in U+FFFD is an incomplete multi-byte character (a token split a UTF-8 sequence); it is
# held back until the next token completes it, so a stream never shows a replacement character mid-word.
_INCOMPLETE = "\ufffd"
# The repetition penalty's range: 1.0 is off; past 2 the penalty pushes even the prompt's own words out and the
# reply stops making sense (below 1 it would favour repeats, which nobody asks for).
MIN_REPETITION_PENALTY = 1.0
MAX_REPETITION_PENALTY = 2.0
# What a conversation starts with, in the Studio's Chat and in `hone chat` / `hone generate`: greedy replies of small
# models often loop one phrase until the token limit, and 1.1 ends most such loops while leaving ordinary replies as
# they are. Scoring (hone eval, checkpoint scores) keeps GenerationSettings' own 1.0: a score compares answers as the
# model gives them.
CHAT_REPETITION_PENALTY = 1.1


class StopFlag(Protocol):
    """Anything with `is_set()` (a threading.Event): generation ends at the next token once it is set."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class GenerationSettings:
    """How a reply is sampled."""

    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy (the same answer every time, easiest to compare side by side)
    top_p: float = 1.0  # nucleus sampling: keep the smallest set of tokens whose probability reaches top_p
    seed: int = 0
    # > 1 makes every token already in the prompt or the reply less likely (its positive logit divided by the penalty,
    # a negative one multiplied), which stops a small model repeating one phrase until max_new_tokens; 1.0 = off.
    repetition_penalty: float = 1.0
    system_prompt: str = ""  # sent as a system message before the conversation; "" = none

    def __post_init__(self) -> None:
        from hone.core.errors import ConfigError

        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens is {self.max_new_tokens}", "ask for at least 1 new token")
        if self.temperature < 0:
            raise ConfigError(f"temperature is {self.temperature}", "use 0 (greedy) or a positive temperature")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p is {self.top_p}", "use a value in (0, 1]")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ConfigError(
                f"repetition_penalty is {self.repetition_penalty}",
                f"use {MIN_REPETITION_PENALTY} (off) to {MAX_REPETITION_PENALTY}; 1.1 to 1.3 usually ends a loop",
            )


class Generation:
    """One reply being decoded token by token with its own KV cache.

    Args:
        model: a causal LM (a peft model when `adapter_enabled` is given).
        tokenizer: its tokenizer, with a chat template.
        messages: the conversation so far, `[{"role": "user", "content": "..."}]`.
        settings: sampling settings.
        adapter_enabled: False runs the base weights of a peft model (its adapter switched off for each step);
            None or True runs the model as it is.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        settings: GenerationSettings = GenerationSettings(),
        *,
        adapter_enabled: bool | None = None,
    ):
        import torch

        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self._use_base = adapter_enabled is False
        self._device = next(model.parameters()).device
        prompt = _render_prompt(tokenizer, messages, settings.system_prompt)
        prompt_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        self.prompt_tokens = int(prompt_ids.shape[1])
        self._seen = set(prompt_ids[0].tolist())  # token ids the repetition penalty applies to (prompt + reply)
        self._next_input = prompt_ids.to(self._device)  # (1, prompt_len) int64, then (1, 1) per step
        self._cache, self._cache_arg = _new_cache(model)
        self._generated: list[int] = []
        self._emitted = ""
        self._stop_ids = _stop_token_ids(model, tokenizer)
        self._generator = None
        if settings.temperature > 0:
            self._generator = torch.Generator(device=self._device).manual_seed(settings.seed)
        self.done = False

    @property
    def token_ids(self) -> list[int]:
        """Ids generated so far (without the prompt)."""
        return list(self._generated)

    def step(self) -> str:
        """Decode one token; returns the new text ('' when nothing printable yet). Sets `done` at the end."""
        import torch

        if self.done:
            return ""
        adapter_off = self.model.disable_adapter() if self._use_base else nullcontext()
        with torch.inference_mode(), adapter_off:
            out = self.model(input_ids=self._next_input, use_cache=True, **{self._cache_arg: self._cache})
        token = self._pick(out.logits[0, -1].float())  # logits: (vocab,) float32
        if token in self._stop_ids:
            self.done = True
            return self._flush(final=True)
        self._generated.append(token)
        self._seen.add(token)
        self._next_input = torch.tensor([[token]], device=self._device)
        if len(self._generated) >= self.settings.max_new_tokens:
            self.done = True
        return self._flush(final=self.done)

    def _pick(self, logits: Any) -> int:
        import torch

        penalty = self.settings.repetition_penalty
        if penalty != 1.0 and self._seen:
            seen = torch.tensor(sorted(self._seen), device=logits.device)
            picked = logits[seen]
            logits = logits.index_copy(0, seen, torch.where(picked > 0, picked / penalty, picked * penalty))
        if self._generator is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.settings.temperature, dim=-1)
        if self.settings.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep tokens while the mass before them is below top_p (so the first token is always kept)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < self.settings.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=self._generator))

    def _flush(self, final: bool) -> str:
        text = self.tokenizer.decode(self._generated, skip_special_tokens=True)
        if not final and text.endswith(_INCOMPLETE):
            return ""
        if not text.startswith(self._emitted):  # a tokenizer re-spaced earlier text: emit only what is new
            common = len(_common_prefix(text, self._emitted))
            self._emitted = text[:common]
        piece, self._emitted = text[len(self._emitted) :], text
        return piece


def stream_reply(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    settings: GenerationSettings = GenerationSettings(),
    *,
    adapter_enabled: bool | None = None,
    stop: StopFlag | None = None,
) -> Iterator[str]:
    """Yield the reply to `messages` piece by piece until an end token, max_new_tokens, or `stop` is set."""
    generation = Generation(model, tokenizer, messages, settings, adapter_enabled=adapter_enabled)
    while not generation.done and not (stop and stop.is_set()):
        piece = generation.step()
        if piece:
            yield piece


def stream_side_by_side(
    model: Any,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    settings: GenerationSettings = GenerationSettings(),
    stop: StopFlag | None = None,
    *,
    tuned_messages: list[dict[str, Any]] | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield `(BASE, piece)` and `(TUNED, piece)` in turn, one token each, from one peft model.

    The base reply runs with the adapter switched off, the tuned one with it on; both keep their own KV cache,
    so the result equals decoding each alone. `tuned_messages` lets the tuned side continue its own conversation
    (its earlier replies differ from the base's); by default both answer `messages`.
    """
    generations = {
        BASE: Generation(model, tokenizer, messages, settings, adapter_enabled=False),
        TUNED: Generation(model, tokenizer, tuned_messages or messages, settings, adapter_enabled=True),
    }
    while not (stop and stop.is_set()):
        active = [(side, g) for side, g in generations.items() if not g.done]
        if not active:
            return
        for side, generation in active:
            piece = generation.step()
            if piece:
                yield side, piece
            if stop and stop.is_set():
                return


class ChatModels:
    """A base model and optionally its adapter, ready to chat (eval mode, no gradients).

    Args:
        model: a causal LM, or a peft model wrapping one.
        tokenizer: its tokenizer with a chat template.
        has_adapter: whether `model` is a peft model whose adapter can be switched off for the base's replies.
    """

    def __init__(self, model: Any, tokenizer: Any, has_adapter: bool):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.has_adapter = has_adapter

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        adapter_dir: str | Path | None = None,
        *,
        device: str | None = None,
        model_overrides: dict[str, Any] | None = None,
    ) -> ChatModels:
        """Load the base (any form `hone.core.models.load.load_model` takes) and, if given, a PEFT adapter folder."""
        from hone.core.config import ModelConfig
        from hone.core.models.load import load_model

        device = device or _default_device()
        model_cfg = ModelConfig(**{**(model_overrides or {}), "name_or_path": model_name_or_path})
        loaded = load_model(model_cfg, device=device, for_training=False)
        model = loaded.model
        if adapter_dir:
            from peft import PeftModel

            from hone.core.errors import ModelError

            if not (Path(adapter_dir) / "adapter_config.json").exists():
                raise ModelError(
                    f"{adapter_dir} holds no adapter_config.json",
                    "choose a run's adapter folder (RUN_DIR/adapter) or an exported PEFT adapter",
                )
            model = PeftModel.from_pretrained(model, str(adapter_dir)).to(device)
        return cls(model, loaded.tokenizer, has_adapter=bool(adapter_dir))

    @classmethod
    def for_run(cls, run_dir: str | Path, *, device: str | None = None, adapter: bool = True) -> ChatModels:
        """The base model a run trained on (from its config.toml) with the run's adapter (`adapter=False`: the base
        alone), and the tokenizer saved with the adapter where there is one: it carries the chat template the run
        trained with, which may not be the base's own."""
        from hone.core.config import RunConfig
        from hone.core.errors import ModelError

        run_dir = Path(run_dir)
        config = RunConfig.load(run_dir / "config.toml")
        adapter_dir = run_dir / "adapter"
        if adapter and not adapter_dir.is_dir():
            raise ModelError(
                f"run {run_dir.name} has no adapter yet (no {adapter_dir})",
                "wait for the run to finish or stop it (stopping saves the adapter)",
            )
        overrides = {k: v for k, v in dataclasses.asdict(config.model).items() if k != "name_or_path"}
        chat = cls.load(
            config.model.name_or_path, adapter_dir if adapter else None, device=device, model_overrides=overrides
        )
        # Text models only: a vision model's processor (which has a `.tokenizer`) stays the base's.
        if (adapter_dir / "tokenizer_config.json").is_file() and not hasattr(chat.tokenizer, "tokenizer"):
            from hone.core.models.load import load_tokenizer

            chat.tokenizer = load_tokenizer(str(adapter_dir), None, config.model)
        return chat

    def system_prompt_refusal(self) -> str:
        """Empty when the tokenizer's chat template takes a system message, else why not, in words for the user."""
        if not hasattr(self, "_system_refusal"):
            self._system_refusal = system_prompt_refusal(self.tokenizer)
        return self._system_refusal

    def stream(
        self,
        messages: list[dict[str, Any]],
        settings: GenerationSettings = GenerationSettings(),
        *,
        use_adapter: bool = True,
        stop: StopFlag | None = None,
    ) -> Iterator[str]:
        """One reply, from the fine-tuned model (use_adapter) or the base."""
        enabled = None if not self.has_adapter else use_adapter
        return stream_reply(self.model, self.tokenizer, messages, settings, adapter_enabled=enabled, stop=stop)

    def stream_both(
        self,
        messages: list[dict[str, Any]],
        settings: GenerationSettings = GenerationSettings(),
        stop: StopFlag | None = None,
        *,
        tuned_messages: list[dict[str, Any]] | None = None,
    ) -> Iterator[tuple[str, str]]:
        """Base and fine-tuned replies interleaved as `(side, piece)`; base only when there is no adapter."""
        if not self.has_adapter:
            return ((BASE, piece) for piece in stream_reply(self.model, self.tokenizer, messages, settings, stop=stop))
        return stream_side_by_side(
            self.model, self.tokenizer, messages, settings, stop=stop, tuned_messages=tuned_messages
        )


def system_prompt_refusal(tokenizer: Any) -> str:
    """Empty when `tokenizer`'s chat template renders a system message, else a sentence saying it does not: some
    templates (Gemma's, early Mistral's) raise on one, others drop it silently."""
    marker = "Hone system prompt probe"
    conversation = [{"role": "system", "content": marker}, {"role": "user", "content": "Hello"}]
    try:
        rendered = render_conversation(tokenizer, conversation, add_generation_prompt=True)
    except ValueError as e:
        return f"this model's chat template takes no system message ({e})"
    if marker not in rendered:
        return "this model's chat template leaves system messages out"
    return ""


def _render_prompt(tokenizer: Any, messages: list[dict[str, Any]], system_prompt: str) -> str:
    """The conversation through the chat template, after a system message when `system_prompt` is set."""
    if not system_prompt:
        return render_conversation(tokenizer, messages, add_generation_prompt=True)
    refusal = system_prompt_refusal(tokenizer)
    if refusal:
        from hone.core.errors import ModelError

        raise ModelError(refusal, "clear the system prompt to chat with this model")
    system = [{"role": "system", "content": system_prompt}]
    return render_conversation(tokenizer, system + list(messages), add_generation_prompt=True)


def _new_cache(model: Any) -> tuple[Any, str]:
    """An empty KV cache the forward fills in place, and the keyword the model takes it by (transformers renamed
    `past_key_values` to `cache` in 5.2x; both spellings are supported from 5.17 on)."""
    import inspect

    from transformers import DynamicCache

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = inspect.signature(type(inner).forward).parameters
    keyword = "cache" if "cache" in names else "past_key_values"
    return DynamicCache(config=inner.config), keyword


def _stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = set()
    for value in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

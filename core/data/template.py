"""Chat templates: render a conversation and find which characters belong to assistant turns.

Templates are Jinja run in a sandbox set up the way transformers runs them (same filters and globals), compiled
once per template. Assistant spans come from rendering growing prefixes of the conversation
(`ChatTemplate.render_with_spans`), which works for any template, with or without `{% generation %}` markers; a
span holds the turn's content and the template's end-of-turn text (the model must learn to stop), not the role
header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

# Used when a tokenizer has no chat template of its own (base models): plain ChatML, rendered as text.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# `data.chat_template` names Hone knows (besides a file path; "" = the tokenizer's own).
NAMED_TEMPLATES = {"chatml": FALLBACK_TEMPLATE}


def template_setting_source(setting: str) -> str | None:
    """The Jinja text `data.chat_template` asks for: None for "" (the tokenizer's own), a named template, or a
    file's text.

    Raises:
        DataError: a file that cannot be read or is not UTF-8 text, naming the setting.
    """
    from hone.core.errors import DataError

    if not setting:
        return None
    if setting in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[setting]
    try:
        with open(setting, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(
            f"data.chat_template: cannot read {setting!r} ({getattr(e, 'strerror', None) or e})",
            f"give a Jinja template file, {', '.join(NAMED_TEMPLATES)}, or leave it empty for the model's own",
        ) from None


def apply_template_setting(tokenizer, setting: str) -> str | None:
    """Give `tokenizer` (or a processor) the chat template the run trains with, so the data, the chat page and the
    saved adapter all use it; returns a line for the run's first lines, or None when the model's own is used.

    A tokenizer without a template of its own gets ChatML (FALLBACK_TEMPLATE) and the line says so."""
    source = template_setting_source(setting)
    targets = [tokenizer] + ([tokenizer.tokenizer] if hasattr(tokenizer, "tokenizer") else [])
    if source is None:
        if any(getattr(t, "chat_template", None) for t in targets):
            return None
        source, said = (
            FALLBACK_TEMPLATE,
            "ChatML (the model has no chat template of its own; data.chat_template sets another)",
        )
    else:
        said = "chatml" if setting in NAMED_TEMPLATES else f"from {setting}"
    try:
        compile_template(source)  # a template that does not parse fails here, before any row is read
    except Exception as e:
        from hone.core.errors import DataError

        raise DataError(
            f"data.chat_template {setting or '(ChatML)'}: not a valid Jinja template ({e})",
            "fix the template, or leave data.chat_template empty for the model's own",
        ) from None
    for target in targets:
        target.chat_template = source
    return f"chat template: {said}"


class TemplateFailure(Exception):
    """The template raised or produced something the assistant turns cannot be located in."""


@lru_cache(maxsize=16)
def compile_template(source: str):
    """Compile a chat template in a sandbox equivalent to the one transformers uses for `apply_chat_template`."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` renders its body (the spans come from prefix rendering)."""

        tags = {"generation"}  # noqa: RUF012 - jinja reads this class attribute

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@dataclass
class ChatTemplate:
    """A compiled template plus the variables it sees besides `messages` (bos_token, eos_token, ...).

    Attributes:
        source: the Jinja text.
        variables: special-token strings and other template variables.
        is_fallback: True when the tokenizer had no template and FALLBACK_TEMPLATE is used.
    """

    source: str
    variables: dict[str, Any]
    is_fallback: bool = False

    @classmethod
    def for_tokenizer(cls, tokenizer) -> ChatTemplate:
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):  # several named templates: the default one is for chat
            source = source.get("default") or next(iter(source.values()))
        variables = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
        return cls(source=source or FALLBACK_TEMPLATE, variables=variables, is_fallback=not source)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        try:
            return compile_template(self.source).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.variables
            )
        except Exception as e:  # a template can raise anything (raise_exception, KeyError on a missing key, ...)
            raise TemplateFailure(str(e) or type(e).__name__) from None

    def render_with_spans(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """Render the conversation and locate its assistant turns.

        Each span comes from rendering growing prefixes of the conversation:

            before = render(messages[:i], add_generation_prompt=True)    # ends with e.g. "<|im_start|>assistant\\n"
            upto   = render(messages[:i + 1])                            # adds the turn: "...content<|im_end|>\\n"
            span of turn i = [len(before), len(upto))                    # when both are prefixes of the full render

        So the span holds the assistant's content and the template's end-of-turn text (the model must learn to
        stop), and not the role header. Templates that rewrite earlier turns (e.g. drop old reasoning) break the
        prefix property; then the turn's content is found in the full render after the previous span, and the
        end-of-turn text that `upto` puts after the content is taken along when the full render has it too.

        Returns:
            (text, spans): the full render, and one [start, end) character span per assistant turn, in order.

        Raises:
            TemplateFailure: the template raised, or an assistant turn cannot be found in the render.
        """
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        cursor = 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            upto = full if i == len(messages) - 1 else self.render(messages[: i + 1])
            try:
                before = self.render(messages[:i], add_generation_prompt=True) if i else None
            except TemplateFailure:
                before = None  # some templates refuse a conversation that ends before an assistant turn
            if before is not None and full.startswith(upto) and upto.startswith(before) and len(before) >= cursor:
                start, end = len(before), len(upto)
            else:
                start, end = _locate(full, upto, message, cursor, before, i)
            # Whitespace after the end-of-turn marker (ChatML's "\n") belongs to the template, not to the turn.
            end = start + len(full[start:end].rstrip())
            spans.append((start, end))
            cursor = end
        return full, spans


def _locate(
    full: str, upto: str, message: dict[str, Any], cursor: int, before: str | None, index: int
) -> tuple[int, int]:
    """Find an assistant turn whose render is not a prefix of the full render (see `render_with_spans`)."""
    content = message["content"]
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    content = content.strip()
    if before is not None and full.startswith(before) and len(before) >= cursor:
        cursor = len(before)
    at = full.find(content, cursor) if content else cursor
    if at < 0:
        raise TemplateFailure(
            f"the chat template changes assistant turn {index} so that its text cannot be found "
            "in the rendered conversation"
        )
    end = at + len(content)
    in_upto = upto.rfind(content) if content else -1
    if in_upto >= 0:
        tail = upto[in_upto + len(content) :]
        common = 0
        while common < len(tail) and end + common < len(full) and full[end + common] == tail[common]:
            common += 1
        end += common
    start = cursor if before is not None and cursor == len(before) and full.startswith(before) else at
    return start, end

"""Chat templates: render a conversation and find which characters belong to assistant turns.

Templates are Jinja run in a sandbox set up the way transformers runs them (same filters and globals), compiled
once per template. Assistant spans come from rendering growing prefixes of the conversation
(`ChatTemplate.render_with_spans`), which works for any template, with or without `{% generation %}` markers; a
span holds the turn's content and the template's end-of-turn text (the model must learn to stop), not the role
header.

A template comes from the Hub or a file, so it renders under limits (`_BoundedEnvironment`): a result over
TEMPLATE_CHARS_PER_INPUT x the conversation's characters + TEMPLATE_BASE_CHARS is refused before it is made (string
repetition, padding widths, big integers), and a render past TEMPLATE_TIME_LIMIT_S stops at the next operation
(loops are bounded by the sandbox's range limit). Either raises TemplateLimit: the template's fault, not a row's.
Within the limits the text is the one transformers renders, byte for byte.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

# A render may make this many characters per character of its input (messages and special tokens): real templates
# add a header per turn and at most repeat the system prompt, far below this; 'A' * 2**31 is refused before it is
# made.
TEMPLATE_CHARS_PER_INPUT = 4
# ... plus this many, for the template's own text (tool descriptions, a default system prompt).
TEMPLATE_BASE_CHARS = 1 << 20
# One render may take this long: real templates render a conversation in well under 10 ms; nested loops of
# range(100000) would run for hours.
TEMPLATE_TIME_LIMIT_S = 1.0
# An integer power may have at most this many bits (2**31 has 32; 10**10**9 would take minutes to compute).
_MAX_POWER_BITS = 4096
_DIGITS = re.compile(r"\d+")

# Used when a tokenizer has no chat template of its own (base models): plain ChatML, rendered as text.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# `data.chat_template` names Hone knows (besides a file path; "" = the tokenizer's own).
NAMED_TEMPLATES = {"chatml": FALLBACK_TEMPLATE}
# Largest chat template file read: real ones are 1-20 KB (with tool-calling instructions); /dev/zero is endless.
MAX_TEMPLATE_BYTES = 1 << 20
_TEMPLATE_ADVICE = f"give a Jinja template file, {', '.join(NAMED_TEMPLATES)}, or leave it empty for the model's own"


def check_template_file(setting: str) -> None:
    """Raise DataError unless `setting` names a regular file of at most MAX_TEMPLATE_BYTES (found from its stat:
    a FIFO is never opened, so nothing waits for a writer)."""
    from hone.core.data.loaders import not_regular_file
    from hone.core.errors import DataError

    try:
        other = not_regular_file(setting)
        size = os.stat(setting).st_size
    except FileNotFoundError:
        raise DataError(f"data.chat_template: no file {setting!r}", _TEMPLATE_ADVICE) from None
    except OSError as e:
        raise DataError(f"data.chat_template: cannot read {setting!r} ({e.strerror or e})", _TEMPLATE_ADVICE) from None
    if other:
        raise DataError(f"data.chat_template: {setting!r} is {other}, not a template file", _TEMPLATE_ADVICE)
    if size > MAX_TEMPLATE_BYTES:
        raise DataError(
            f"data.chat_template: {setting!r} has {size:,} bytes; a chat template has a few KB (Hone reads up to "
            f"{MAX_TEMPLATE_BYTES:,})",
            _TEMPLATE_ADVICE,
        )


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
    if os.path.lexists(setting):  # a missing file is reported by open() below
        check_template_file(setting)
    try:
        with open(setting, encoding="utf-8") as handle:
            return handle.read(MAX_TEMPLATE_BYTES + 1)[:MAX_TEMPLATE_BYTES]  # bounded, should it have grown since
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(
            f"data.chat_template: cannot read {setting!r} ({getattr(e, 'strerror', None) or e})", _TEMPLATE_ADVICE
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


class TemplateLimit(Exception):
    """The template went past a size or time limit: the template's fault, so the caller stops rather than skip the
    row. `what` says which limit, in words that follow "the chat template"."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what

    def for_row(self, source: str):
        """The DataError that stops a data check or a run: once, naming the row it happened on and the limit."""
        from hone.core.errors import DataError

        return DataError(
            f"the chat template {self.what} (on {source}); a template over Hone's limits is stopped rather than "
            "run on every row",
            "the template is at fault, not the row: set data.chat_template to a template file you trust, or chatml",
        )


@dataclass
class _Budget:
    """The limits of one render: the most characters any value may have, and when it must end."""

    max_chars: int
    deadline: float

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"took over {TEMPLATE_TIME_LIMIT_S:g} s to render one conversation")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, str | list | tuple | dict) and len(value) > self.max_chars:
            raise TemplateLimit(
                f"made a value of {len(value):,} characters or items, over the {self.max_chars:,} "
                "allowed for this conversation"
            )
        return value

    def check_argument(self, value: Any) -> None:
        """A number passed to a call or filter is a size (a padding width, a count): refuse one over the limit."""
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
            raise TemplateLimit(f"asked for a size of {value:,}, over the {self.max_chars:,} allowed")
        self.check_size(value)

    def check_format(self, text: Any) -> None:
        """A format string's widths and precisions ('%2000000000s', '{:>2000000000}') are sizes too."""
        if isinstance(text, str):
            for digits in _DIGITS.findall(text):
                if len(digits) > 12 or int(digits) > self.max_chars:
                    raise TemplateLimit(f"formats with a width of {digits}, over the {self.max_chars:,} allowed")


_budget: ContextVar[_Budget | None] = ContextVar("hone_template_budget", default=None)


def _input_chars(value: Any) -> int:
    """Characters of every string in a conversation (nested dicts and lists, as rows hold them)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_input_chars(k) + _input_chars(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_input_chars(v) for v in value)
    return 0


def _bounded_environment_class():
    """ImmutableSandboxedEnvironment with every operation that can make a big value or run long checked against
    the render's budget (a class made on first use, so importing this module does not import jinja2)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "%", "**"})

        def call_binop(self, context, operator, left, right):
            budget = _budget.get()
            if budget is not None:
                budget.check_time()
                _check_binop(budget, operator, left, right)
            result = super().call_binop(context, operator, left, right)
            return result if budget is None else budget.check_size(result)

        def call(__self, __context, __obj, *args, **kwargs):
            budget = _budget.get()
            if budget is not None:
                budget.check_time()
                for value in (*args, *kwargs.values()):
                    budget.check_argument(value)
            result = super().call(__context, __obj, *args, **kwargs)
            return result if budget is None else budget.check_size(result)

        def wrap_str_format(self, value):
            budget = _budget.get()
            if budget is not None and getattr(value, "__name__", "") in ("format", "format_map"):
                budget.check_format(getattr(value, "__self__", None))
            return super().wrap_str_format(value)

        def getattr(self, obj, attribute):
            budget = _budget.get()
            if budget is None:
                return super().getattr(obj, attribute)
            budget.check_time()
            return budget.check_size(super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            budget = _budget.get()
            if budget is None:
                return super().getitem(obj, argument)
            budget.check_time()
            return budget.check_size(super().getitem(obj, argument))

    return _BoundedEnvironment


def _check_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be over the budget, before Python makes it."""
    sized = (str, list, tuple)
    if operator == "*":
        seq, count = (left, right) if isinstance(left, sized) else (right, left)
        if isinstance(seq, sized) and isinstance(count, int) and len(seq) * count > budget.max_chars:
            raise TemplateLimit(
                f"repeats a value of {len(seq):,} characters or items {count:,} times, over the "
                f"{budget.max_chars:,} allowed"
            )
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        if right * math.log2(abs(left)) > _MAX_POWER_BITS:
            raise TemplateLimit(f"computes a power of over {_MAX_POWER_BITS} bits ({left} ** {right})")
    elif operator == "%" and isinstance(left, str):
        budget.check_format(left)


def _bounded_filter(name: str, function):
    """`function` (a Jinja filter) with the render's budget checked on its arguments and result. The wrapper takes
    the context, which also keeps Jinja from running the filter on constants while compiling, outside any budget
    (`'a'|center(2000000000)` would otherwise be made before the first render)."""
    import jinja2

    passes = getattr(getattr(function, "jinja_pass_arg", None), "name", None)

    @jinja2.pass_context
    def bounded(context, *args, **kwargs):
        budget = _budget.get()
        if budget is not None:
            budget.check_time()
            for value in (*args, *kwargs.values()):
                budget.check_argument(value)
            if name == "format" and args:
                budget.check_format(args[0])
        first = {"context": context, "eval_context": context.eval_ctx, "environment": context.environment}
        result = function(first[passes], *args, **kwargs) if passes in first else function(*args, **kwargs)
        return result if budget is None else budget.check_size(result)

    bounded.__name__ = getattr(function, "__name__", name)
    return bounded


@lru_cache(maxsize=16)
def compile_template(source: str):
    """Compile a chat template in a sandbox equivalent to the one transformers uses for `apply_chat_template`, with
    Hone's limits (render it with `render_bounded`)."""
    import jinja2
    import jinja2.ext

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

    env = _bounded_environment_class()(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render_bounded(template, **variables) -> str:
    """Render a compiled template within the limits for its input (see the module docstring).

    Raises:
        TemplateLimit: a value over the size limit, or the time limit passed.
    """
    max_chars = TEMPLATE_CHARS_PER_INPUT * _input_chars(variables) + TEMPLATE_BASE_CHARS
    token = _budget.set(_Budget(max_chars, time.monotonic() + TEMPLATE_TIME_LIMIT_S))
    try:
        parts, total = [], 0
        for part in template.generate(**variables):
            total += len(part)
            if total > max_chars:
                raise TemplateLimit(f"wrote over {max_chars:,} characters for one conversation")
            parts.append(part)
        return "".join(parts)
    finally:
        _budget.reset(token)


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
        """The conversation as the template writes it.

        Raises:
            TemplateFailure: the template raised (the row's fault, or a template that cannot take it).
            TemplateLimit: the template went past a size or time limit (the template's fault).
        """
        try:
            return render_bounded(
                compile_template(self.source),
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        except TemplateLimit:
            raise
        except RecursionError:
            raise TemplateLimit("calls itself too deeply (recursion)") from None
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


def render_conversation(tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, ...)` under the same limits as the training data
    (chat, evaluation and export render conversations with templates from the Hub too). A tokenizer without a
    template is left to transformers, whose error says so.

    Raises:
        ModelError: the template went past a size or time limit (the template's fault, said once).
        ValueError: the template raised on this conversation (transformers raises jinja's errors here).
    """
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    try:
        return ChatTemplate.for_tokenizer(tokenizer).render(messages, add_generation_prompt=add_generation_prompt)
    except TemplateLimit as e:
        from hone.core.errors import ModelError

        raise ModelError(
            f"the chat template {e.what}; a template over Hone's limits is stopped rather than run",
            "the template is at fault, not the conversation: train with data.chat_template set to a template file "
            "you trust (or chatml), and chat with that run's adapter",
        ) from None
    except TemplateFailure as e:
        raise ValueError(f"the chat template refused the conversation: {e}") from None


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

"""What a chat template does to each message, learned by rendering it, so it can be rewritten for other runtimes.

Most chat templates wrap every message in fixed text that depends only on its role (ChatML:
`<|im_start|>user\\n` ... `<|im_end|>\\n`; Llama 3: `<|start_header_id|>user<|end_header_id|>\\n\\n` ...
`<|eot_id|>`), add a fixed generation prompt, and sometimes insert a default system message. Hone renders the
template (through transformers, i.e. exactly as training did) on conversations whose contents are unique markers,
and reads the wrappers off the text between the markers. Templates that do something else (merge the system
prompt into the first user turn, number the turns, ...) are reported as not per-message, never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from hone.core.data.template import render_conversation
from hone.core.errors import HoneError
from hone.core.export.formats import ExportError

# Marker contents: plain words that no template rewrites (no surrounding spaces, no special characters).
_SYSTEM, _USER1, _ASSISTANT1, _USER2 = "HoneMarkSystemQ7", "HoneMarkUserA3", "HoneMarkAssistantB5", "HoneMarkUserC9"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatLayout:
    """The fixed text a chat template puts around each message.

    Attributes:
        bos: the BOS token text the template writes first ("" when it writes none). Runtimes that add BOS
            themselves (llama.cpp, Ollama) leave it out of their template.
        wrap: role -> (prefix, suffix) around the message content.
        generation_prompt: appended after the last message to let the assistant answer.
        default_system: the system message the template inserts when the conversation has none (or None).
    """

    bos: str
    wrap: dict[str, tuple[str, str]]
    generation_prompt: str
    default_system: str | None

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render a conversation the way the template does (for checks and runtimes without Jinja)."""
        if self.default_system is not None and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": self.default_system}, *messages]
        text = self.bos + "".join(self.wrap[m["role"]][0] + m["content"] + self.wrap[m["role"]][1] for m in messages)
        return text + (self.generation_prompt if add_generation_prompt else "")

    @property
    def turn_end(self) -> str:
        """The text that ends an assistant turn, stripped of trailing whitespace (e.g. "<|im_end|>")."""
        return self.wrap["assistant"][1].strip()


class NotPerMessage(ExportError):
    """The chat template is not a fixed wrapper per message."""


def _render(tokenizer, messages, generation_prompt: bool) -> str:
    try:
        return render_conversation(tokenizer, messages, add_generation_prompt=generation_prompt)
    except HoneError:  # over Hone's limits: said as it is
        raise
    except Exception as e:  # a template may raise anything (jinja's raise_exception included)
        raise NotPerMessage(
            f"the chat template refuses a plain conversation: {e}",
            "see the template in the adapter folder's chat_template.jinja",
        ) from None


def _split(text: str, markers: list[str]) -> list[str]:
    """Text pieces between the markers, in order; NotPerMessage when a marker is missing or repeated."""
    pieces, rest = [], text
    for marker in markers:
        if rest.count(marker) != 1:
            raise NotPerMessage(
                "the chat template does not write each message's content exactly once",
                "Hone can rewrite templates that wrap each message in fixed text",
            )
        before, rest = rest.split(marker)
        pieces.append(before)
    return [*pieces, rest]


def infer_layout(tokenizer) -> ChatLayout:
    """Learn the per-role wrappers, generation prompt and default system message of the tokenizer's template.

    Raises:
        ExportError: no chat template; NotPerMessage: the template is not a fixed wrapper per message.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ExportError("the tokenizer has no chat template", "set one on the base model's tokenizer and retrain")
    s = {"role": "system", "content": _SYSTEM}
    u1, a1, u2 = (
        {"role": "user", "content": _USER1},
        {"role": "assistant", "content": _ASSISTANT1},
        {"role": "user", "content": _USER2},
    )
    markers = [_SYSTEM, _USER1, _ASSISTANT1, _USER2]
    full = _render(tokenizer, [s, u1, a1, u2], True)
    closed = _render(tokenizer, [s, u1, a1, u2], False)
    if not full.startswith(closed):
        raise NotPerMessage("the chat template's generation prompt is not appended at the end", "")
    generation_prompt = full[len(closed) :]
    head, sys_to_user, user_to_assistant, assistant_to_user, user_tail = _split(closed, markers)
    system_suffix = _split(_render(tokenizer, [s], False), [_SYSTEM])[1]
    assistant_suffix = _split(_render(tokenizer, [s, u1, a1], False), markers[:3])[3]
    user_suffix = user_tail
    bos = tokenizer.bos_token or ""
    bos = bos if bos and "bos_token" in str(tokenizer.chat_template) and head.startswith(bos) else ""
    user_prefix = sys_to_user[len(system_suffix) :]
    assistant_prefix = user_to_assistant[len(user_suffix) :]
    consistent = (
        sys_to_user.startswith(system_suffix)
        and user_to_assistant.startswith(user_suffix)
        and assistant_to_user == assistant_suffix + user_prefix
    )
    if not consistent:
        raise NotPerMessage(
            "the chat template's text between messages depends on more than their roles",
            "Hone can rewrite templates that wrap each message in fixed text",
        )
    layout = ChatLayout(
        bos=bos,
        wrap={
            "system": (head[len(bos) :], system_suffix),
            "user": (user_prefix, user_suffix),
            "assistant": (assistant_prefix, assistant_suffix),
        },
        generation_prompt=generation_prompt,
        default_system=None,
    )
    no_system = _render(tokenizer, [u1], True)
    if no_system != layout.render([u1]):
        system_prefix = bos + layout.wrap["system"][0]
        ending = system_suffix + layout.render([u1])[len(bos) :]
        if not (no_system.startswith(system_prefix) and no_system.endswith(ending)):
            raise NotPerMessage(
                "the chat template changes a conversation without a system message in a way "
                "other than adding a default one",
                "",
            )
        layout = ChatLayout(
            bos=bos,
            wrap=layout.wrap,
            generation_prompt=generation_prompt,
            default_system=no_system[len(system_prefix) : len(no_system) - len(ending)],
        )
    return layout


def verify_layout(layout: ChatLayout, tokenizer, render=None) -> list[str]:
    """Conversations where `render` (default: the layout's own) differs from the template; empty = all agree.

    Args:
        render: function(messages) -> text with the generation prompt, e.g. an Ollama template renderer.
    """
    render = render or layout.render
    talks = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
        [
            {"role": "user", "content": "Two lines:\nfirst\n  second"},
            {"role": "assistant", "content": "Got it."},
            {"role": "user", "content": "Thanks."},
        ],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "6"},
            {"role": "user", "content": "And 4+4?"},
        ],
    ]
    return [
        f"{[m['role'] for m in talk]}: template {expected!r} != {got!r}"
        for talk in talks
        if (expected := _render(tokenizer, talk, True)) != (got := render(talk))
    ]

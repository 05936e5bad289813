"""Prompt files for batch answering and evaluation: JSONL rows (`{"prompt"}`, `{"messages"}`, prompt-completion
pairs) or plain text lines, each a conversation to answer and, where the row holds one, the reference reply.

Stdlib only: the CLI and the studio read the file and name each unusable row (file:row: why) before a model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError

ROLES = ("system", "user", "assistant")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")


@dataclass
class Prompt:
    """One prompt to answer.

    Attributes:
        row: its line number in the prompts file (1-based).
        key: "prompt" or "messages": how the input row gave it, and the key the output row repeats it under.
        given: the prompt as given (a string or a list of messages), without a reference reply.
        messages: the conversation the model answers (--system prepended where it has no system message).
        reference: the reply the row already held (a final assistant turn or a "completion"), if any.
    """

    row: int
    key: str
    given: Any
    messages: list[dict[str, str]]
    reference: str | None = None


class BadRow(ValueError):
    """A prompts file row that cannot be a prompt; the message says why."""


def read_prompts(path: Path, system: str = "") -> tuple[list[Prompt], list[str]]:
    """The prompts of a file, and a "file:row: why" line for each row skipped.

    Raises:
        HoneError: the file is missing or unreadable.
    """
    try:
        raw_lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise HoneError(f"prompts file {path} does not exist", "check the prompts file's path") from None
    except OSError as e:
        raise HoneError(f"cannot read prompts file {path}: {e.strerror}", "check the prompts file's path") from None
    lines: list[tuple[int, str]] = []
    skipped: list[tuple[int, str]] = []  # (row, why)
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            skipped.append((number, f"not UTF-8 text (byte {e.start + 1})"))
            continue
        if text.strip():
            lines.append((number, text))
    jsonl = path.suffix.lower() in JSONL_SUFFIXES or (
        path.suffix.lower() not in TEXT_SUFFIXES and bool(lines) and lines[0][1].lstrip().startswith("{")
    )
    prompts = []
    for number, text in lines:
        try:
            prompts.append(
                _json_prompt(number, text)
                if jsonl
                else Prompt(number, "prompt", text.strip(), [{"role": "user", "content": text.strip()}])
            )
        except BadRow as e:
            skipped.append((number, str(e)))
            continue
        if system and prompts[-1].messages[0]["role"] != "system":
            prompts[-1].messages.insert(0, {"role": "system", "content": system})
    return prompts, [f"{path}:{number}: {why}" for number, why in sorted(skipped)]


def _json_prompt(number: int, text: str) -> Prompt:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRow(f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(record, dict):
        raise BadRow(f'{_kind(record)}, not an object like {{"prompt": "..."}}')
    if "messages" in record:
        given, reference = _conversation(record["messages"], "messages")
        return Prompt(number, "messages", given, [dict(m) for m in given], reference)
    if "prompt" in record:
        prompt, reference = record["prompt"], _completion(record.get("completion"))
        if isinstance(prompt, list):  # TRL's conversational prompt-completion rows
            given, earlier = _conversation(prompt, "prompt")
            return Prompt(number, "prompt", given, [dict(m) for m in given], reference or earlier)
        if not isinstance(prompt, str):
            raise BadRow(f"prompt is {_kind(prompt)}, not a string")
        if not prompt.strip():
            raise BadRow("prompt is empty")
        return Prompt(number, "prompt", prompt, [{"role": "user", "content": prompt}], reference)
    found = ", ".join(map(str, record)) or "none"
    raise BadRow(f'no "prompt" or "messages" field (found: {found})')


def _conversation(messages: Any, field: str) -> tuple[list[dict[str, str]], str | None]:
    """The turns to send (a final assistant turn split off as the reference)."""
    if not isinstance(messages, list) or not messages:
        raise BadRow(f'{field} is not a non-empty list of {{"role", "content"}} objects')
    turns = []
    for k, message in enumerate(messages, start=1):
        where = f"{field}[{k}]"
        if not isinstance(message, dict):
            raise BadRow(f'{where} is {_kind(message)}, not a {{"role", "content"}} object')
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRow(f"{where}.role is {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRow(f"{where}.content is {'missing' if content is None else 'not a string'}")
        turns.append({"role": role, "content": content})
    reference = None
    if turns[-1]["role"] == "assistant":
        reference = turns.pop()["content"]
    if not turns or turns[-1]["role"] != "user":
        raise BadRow(
            f"{field} has no user turn to answer at the end (roles: "
            f"{', '.join(m['role'] for m in turns) or 'assistant only'})"
        )
    if not turns[-1]["content"].strip():
        raise BadRow(f"{field}: the last user turn is empty")
    return turns, reference


def _kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _completion(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content")
        return content if isinstance(content, str) else None
    return None

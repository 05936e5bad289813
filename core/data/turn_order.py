"""Turn-order rules for a normalized conversation: what is merged, what is skipped, what is kept with a note.

The rules (the README's format table states the same):

- two user turns in a row, or two assistant turns in a row: merged into one turn, a blank line between them (an
  assistant turn with tool calls, and tool turns, are never merged: tool use has its own order);
- a system turn anywhere but at the start: the row is skipped (templates place or drop it differently);
- the assistant speaks first and no user turn is ever answered ([assistant, user], ShareGPT [gpt, human]): the row
  is skipped, the roles are probably swapped;
- the assistant speaks first and a later user turn is answered: kept as is (a greeting), with a note;
- the conversation ends with a user turn after an answer: kept as is, with a note (that turn trains nothing unless
  data.train_on = "all").

Every merged or noted row is listed in the dataset report under its note; every skipped row under
`rows.TURN_ORDER`.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hone.core.data.rows import TURN_ORDER, RowError

# Note keys: the report prints "N rows <key> (kept...): file:row, ...".
MERGED_USER = "had two user turns in a row, merged into one turn"
MERGED_ASSISTANT = "had two assistant turns in a row, merged into one turn"
ASSISTANT_FIRST = "starts with an assistant turn"
USER_LAST = "ends with a user turn that nothing answers"
_MERGED = {"user": MERGED_USER, "assistant": MERGED_ASSISTANT}
# Joins the texts of merged turns.
_JOIN = "\n\n"


def check_turn_order(messages: list[dict[str, Any]], role_fields: list[str]) -> list[str]:
    """Apply the rules above to `messages` in place and return the notes for the row.

    Args:
        messages: the row's turns with canonical roles; merged turns are replaced by one.
        role_fields: per turn, where its role came from in the user's record ("messages[2].role",
            "conversations[0].from"); "" for flat formats (alpaca, prompt-completion strings), whose order is fixed.

    Raises:
        RowError(TURN_ORDER): the row is skipped; the field names the turn at fault.
    """
    notes: list[str] = []
    roles = [m["role"] for m in messages]
    for i, role in enumerate(roles):
        if role == "system" and any(r != "system" for r in roles[:i]):
            raise RowError(
                TURN_ORDER,
                role_fields[i],
                f"is a system turn after the conversation started (turn {i}); "
                "a system message goes first: move it there or remove it",
            )
    spoken = [i for i, r in enumerate(roles) if r in ("user", "assistant")]
    answered = any(roles[a] == "user" and roles[b] == "assistant" for a, b in pairwise(spoken))
    if spoken and roles[spoken[0]] == "assistant":
        if "user" in roles and not answered:
            raise RowError(
                TURN_ORDER,
                role_fields[spoken[0]],
                "the assistant speaks first and no user turn is "
                "answered; check whether the roles are swapped (user/assistant, human/gpt)",
            )
        notes.append(ASSISTANT_FIRST)
    if spoken and roles[spoken[-1]] == "user" and answered:
        notes.append(USER_LAST)
    i = 1
    while i < len(messages):
        before, turn = messages[i - 1], messages[i]
        if (
            turn["role"] == before["role"]
            and turn["role"] in _MERGED
            and not before.get("tool_calls")
            and not turn.get("tool_calls")
        ):
            before["content"] = _joined(before["content"], turn["content"])
            del messages[i]
            if _MERGED[turn["role"]] not in notes:
                notes.append(_MERGED[turn["role"]])
            continue
        i += 1
    return notes


def _joined(first: str | list[dict[str, Any]], second: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Two turns' contents as one: strings joined by a blank line; typed parts concatenated around a text part."""
    if isinstance(first, str) and isinstance(second, str):
        return first + _JOIN + second
    parts = [_as_parts(first), [{"type": "text", "text": _JOIN}], _as_parts(second)]
    return [part for group in parts for part in group]


def _as_parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []

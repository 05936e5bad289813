"""Row formats: detect which one a file uses and normalize each raw record into a `Row`.

The formats are the values of `DataConfig.format`: messages, sharegpt, alpaca, prompt-completion and text (each
record's shape is beside `DETECTION_ORDER`). Any format may carry an `images` column (LLaVA style: `<image>`
placeholders in the text mark where each goes). `DataConfig.columns` maps the canonical column names (and `role` /
`content` inside turns) to the user's own names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hone.core.data.images import parse_image_ref
from hone.core.data.loaders import JsonTooDeep, loads_json
from hone.core.data.rows import (
    EMPTY_CONTENT,
    EMPTY_CONVERSATION,
    EMPTY_TEXT,
    IMAGE_MISMATCH,
    MISSING_FIELD,
    NO_ASSISTANT,
    ROLE_ALIASES,
    ROLES,
    TOO_DEEP,
    UNKNOWN_FORMAT,
    UNKNOWN_ROLE,
    WRONG_TYPE,
    ImageRef,
    Row,
    RowError,
    preview,
)
from hone.core.data.turn_order import check_turn_order

IMAGE_PLACEHOLDER = "<image>"
# Checked in this order; the first format whose required columns are all present wins. A record of each format:
#     messages           {"messages": [{"role": "user", "content": "..."}, ...]}  (OpenAI / ChatML style; content a
#                        string or a list of parts {"type": "text", "text"} / {"type": "image", "image": ...})
#     sharegpt           {"conversations": [{"from": "human", "value": "..."}, ...]}  (human/gpt/system)
#     alpaca             {"instruction", "input" (optional), "output", "system" (optional)}
#     prompt-completion  {"prompt", "completion"}  (strings, or lists of messages as TRL writes them)
#     text               {"text"}  (continued pretraining: every token trained, no chat template)
DETECTION_ORDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("messages", ("messages",)),
    ("sharegpt", ("conversations",)),
    ("alpaca", ("instruction", "output")),
    ("prompt-completion", ("prompt", "completion")),
    ("text", ("text",)),
)
REQUIRED = dict(DETECTION_ORDER)
# Extra message keys passed through to the chat template (tool calls, reasoning); everything else is dropped.
PASSTHROUGH_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content", "thinking")


class ColumnNames:
    """Canonical name -> the user's column name, from `DataConfig.columns`."""

    def __init__(self, mapping: Mapping[str, str] | None = None):
        self.mapping = dict(mapping or {})

    def __getitem__(self, canonical: str) -> str:
        return self.mapping.get(canonical, canonical)

    def get(self, record: Mapping[str, Any], canonical: str, default: Any = None) -> Any:
        return record.get(self[canonical], default)

    def has(self, record: Mapping[str, Any], canonical: str) -> bool:
        return self[canonical] in record


def detect_format(record: Mapping[str, Any], columns: ColumnNames) -> str:
    """The format whose required columns the record has.

    Raises:
        RowError(UNKNOWN_FORMAT): no known format fits; the message lists the record's columns and suggests a
            data.columns mapping for them.
    """
    for name, required in DETECTION_ORDER:
        if all(columns.has(record, c) for c in required):
            return name
    names = [str(k) for k in record]
    found = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "none"
    raise RowError(
        UNKNOWN_FORMAT,
        "",
        f"no columns of a known format (messages, conversations, instruction+output, "
        f"prompt+completion, text); found: {found}. Map yours to Hone's names with data.columns = "
        f"{suggest_columns(names)} (Hone's name = your column)",
    )


# Column names people use for each canonical column, for the mapping `suggest_columns` proposes.
_LOOKALIKES = {
    "prompt": ("question", "query", "input", "instruction", "user", "human", "request", "q", "source", "context"),
    "completion": ("answer", "response", "output", "reply", "assistant", "gpt", "target", "a", "label", "solution"),
    "messages": ("dialog", "dialogue", "conversation", "conversations", "chat", "turns", "history", "thread"),
    "text": ("content", "body", "document", "passage", "article", "sentence", "raw", "contents"),
}


def suggest_columns(names: list[str]) -> str:
    """A data.columns value (TOML) mapping Hone's names to the given columns, e.g. {prompt = "question", ...}."""
    lowered = {n.strip().lower(): n for n in names}

    def pick(canonical: str) -> str | None:
        return next((lowered[alias] for alias in _LOOKALIKES[canonical] if alias in lowered), None)

    prompt, completion = pick("prompt"), pick("completion")
    if prompt and completion and prompt != completion:
        return f'{{prompt = "{prompt}", completion = "{completion}"}}'
    for canonical in ("messages", "text"):
        if found := pick(canonical):
            return f'{{{canonical} = "{found}"}}'
    return '{prompt = "YOUR_QUESTION_COLUMN", completion = "YOUR_ANSWER_COLUMN"}'


# Optional columns each format reads besides its required ones.
OPTIONAL = {
    "messages": ("images",),
    "sharegpt": ("system", "images"),
    "alpaca": ("input", "system", "images"),
    "prompt-completion": ("system", "images"),
    "text": (),
}


def used_columns(fmt: str, columns: ColumnNames) -> list[str]:
    """The user's column names that a format reads."""
    return [columns[c] for c in (*REQUIRED[fmt], *OPTIONAL[fmt])]


def normalize(
    record: Any, fmt: str, columns: ColumnNames, source: str, base_dir: Path | None, require_assistant: bool = True
) -> Row:
    """Turn one raw record into a Row of the given format.

    Args:
        record: the row as read (a dict for every loader; anything else is reported).
        fmt: one of the format names above (not "auto").
        columns: the column mapping.
        source: "file:row" for the Row.
        base_dir: folder that relative image paths resolve against (the dataset file's folder).
        require_assistant: conversations without an assistant turn are skipped (nothing would be trained).

    Raises:
        RowError: the row cannot be used; reason, field and detail say why.
    """
    if fmt == "text":
        text = _field(record, columns, "text")
        if not isinstance(text, str):
            raise RowError(WRONG_TYPE, columns["text"], f"is {_kind(text)}, expected a string")
        if not text.strip():
            raise RowError(EMPTY_TEXT, columns["text"], "is empty")
        return Row(source=source, text=text, format=fmt)
    if fmt in ("messages", "sharegpt"):
        canonical = "messages" if fmt == "messages" else "conversations"
        messages, fields = _turns(_field(record, columns, canonical), columns[canonical], columns)
    elif fmt == "alpaca":
        instruction = _string(record, columns, "instruction")
        extra = _string(record, columns, "input", optional=True)
        output = _string(record, columns, "output")
        prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
        fields = [("", columns["instruction"]), ("", columns["output"])]
    elif fmt == "prompt-completion":
        prompt_turns, prompt_fields = _side(record, columns, "prompt", "user")
        completion_turns, completion_fields = _side(record, columns, "completion", "assistant")
        messages, fields = prompt_turns + completion_turns, prompt_fields + completion_fields
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if fmt != "messages" and columns.has(record, "system") and not any(m["role"] == "system" for m in messages):
        system = _string(record, columns, "system", optional=True)
        if system.strip():
            messages.insert(0, {"role": "system", "content": system})
            fields.insert(0, ("", columns["system"]))
    images = _attach_images(record, columns, messages, base_dir)
    _check_conversation(messages, fields, columns, fmt, require_assistant)
    notes = check_turn_order(messages, [role for role, _ in fields])
    return Row(source=source, messages=messages, images=images, format=fmt, notes=notes)


def _field(record: Any, columns: ColumnNames, canonical: str) -> Any:
    name = columns[canonical]
    if name not in record:
        raise RowError(MISSING_FIELD, name, "is missing")
    return record[name]


def _string(record: Any, columns: ColumnNames, canonical: str, optional: bool = False) -> str:
    name = columns[canonical]
    value = record.get(name) if optional else _field(record, columns, canonical)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise RowError(WRONG_TYPE, name, f"is {_kind(value)}, expected a string")
    return value


def _side(
    record: Any, columns: ColumnNames, canonical: str, role: str
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """A prompt or completion: a string (one turn of `role`) or a list of messages; with each turn's fields."""
    value = _field(record, columns, canonical)
    if isinstance(value, str):
        return [{"role": role, "content": value}], [("", columns[canonical])]
    if isinstance(value, list):
        return _turns(value, columns[canonical], columns)
    raise RowError(WRONG_TYPE, columns[canonical], f"is {_kind(value)}, expected a string or a list of messages")


def _turns(value: Any, where: str, columns: ColumnNames) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Normalize a list of turns (role/content or from/value) into messages with canonical roles.

    Returns:
        (messages, fields): per message, the (role, content) field paths in the user's own names, e.g.
        ("conversations[1].from", "conversations[1].value"), for the messages about that turn.
    """
    if isinstance(value, str):
        value = _json_list(value, where)
    if not isinstance(value, list):
        raise RowError(WRONG_TYPE, where, f"is {_kind(value)}, expected a list of {{role, content}} turns")
    if not value:
        raise RowError(EMPTY_CONVERSATION, where, "is an empty list")
    # The key names this conversation uses: the mapped ones, else ShareGPT's from/value when any turn has them.
    role_names, content_names = (columns["role"], "from", "role"), (columns["content"], "value", "content")
    turns = [t for t in value if isinstance(t, Mapping)]
    usual_role = next((k for k in role_names if any(k in t for t in turns)), columns["role"])
    usual_content = next((k for k in content_names if any(k in t for t in turns)), columns["content"])
    messages, fields = [], []
    for i, turn in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(turn, Mapping):
            raise RowError(WRONG_TYPE, at, f"is {_kind(turn)}, expected an object with role and content")
        rk = next((k for k in role_names if k in turn), usual_role)
        ck = next((k for k in content_names if k in turn), usual_content)
        if rk not in turn:
            raise RowError(MISSING_FIELD, f"{at}.{rk}", "is missing")
        role = turn[rk]
        if not isinstance(role, str):
            raise RowError(WRONG_TYPE, f"{at}.{rk}", f"is {_kind(role)}, expected a string")
        canonical = ROLE_ALIASES.get(role.strip().lower(), role.strip().lower())
        if canonical not in ROLES:
            raise RowError(
                UNKNOWN_ROLE,
                f"{at}.{rk}",
                f"{preview(role)} is not a known role; use system, user, assistant or tool (human/gpt also work)",
            )
        message: dict[str, Any] = {"role": canonical}
        if ck not in turn and not turn.get("tool_calls"):
            raise RowError(MISSING_FIELD, f"{at}.{ck}", "is missing")
        message["content"] = _content(turn.get(ck), f"{at}.{ck}")
        for key in PASSTHROUGH_KEYS:
            if turn.get(key) is not None:
                message[key] = turn[key]
        messages.append(message)
        fields.append((f"{at}.{rk}", f"{at}.{ck}"))
    return messages, fields


def _json_list(text: str, where: str) -> list:
    """A list written as JSON text (how CSV/TSV cells hold conversations)."""
    if text.lstrip().startswith("["):
        try:
            value = loads_json(text)
        except json.JSONDecodeError as e:
            at = f"column {e.colno}" if e.lineno == 1 else f"line {e.lineno}, column {e.colno}"
            raise RowError(
                WRONG_TYPE, where, f"is text that starts like a JSON list but does not parse ({e.msg} at {at})"
            ) from None
        except JsonTooDeep as e:
            raise RowError(TOO_DEEP, where, f"is a JSON list that cannot be used: {e}") from None
        if isinstance(value, list):
            return value
    raise RowError(WRONG_TYPE, where, "is a string, expected a list of {role, content} turns")


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    """A string, or a list of typed parts normalized to {"type": "text", "text"} / {"type": "image", "ref"}."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RowError(WRONG_TYPE, where, f"is {_kind(value)}, expected a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
            continue
        if not isinstance(part, Mapping):
            raise RowError(WRONG_TYPE, at, f'is {_kind(part)}, expected a part like {{"type": "text", ...}}')
        kind = part.get("type")
        if kind is None:
            kind = "text" if "text" in part else "image" if ("image" in part or "image_url" in part) else None
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise RowError(WRONG_TYPE, f"{at}.text", f"is {_kind(text)}, expected a string")
            parts.append({"type": "text", "text": text})
        elif kind in ("image", "image_url", "input_image"):
            raw = next(
                (part[k] for k in ("image", "image_url", "url", "path", "data") if part.get(k) is not None), None
            )
            if raw is None:
                raise RowError(MISSING_FIELD, f"{at}.image", "is missing (give a path, URL, base64 or bytes)")
            parts.append({"type": "image", "ref": raw, "field": at})
        else:
            raise RowError(WRONG_TYPE, f"{at}.type", f"{preview(kind)} is not a known part type; use text or image")
    return parts


def _attach_images(
    record: Any, columns: ColumnNames, messages: list[dict[str, Any]], base_dir: Path | None
) -> list[ImageRef]:
    """Resolve image parts and the LLaVA-style `images` column into ImageRefs, in order of appearance.

    After this, every image part is exactly {"type": "image"} and the returned list holds their references.
    """
    column = columns["images"]
    listed = _listed_images(record, column)
    if listed:
        _place_listed_images(messages, listed, column)
    return _collect_image_refs(messages, listed, column, base_dir)


def _listed_images(record: Any, column: str) -> list[Any]:
    """The `images` column's entries: a list, a JSON list in text, or one image alone; [] when there is none."""
    listed = record.get(column) if isinstance(record, Mapping) else None
    if isinstance(listed, str) and listed.lstrip().startswith("["):
        listed = _json_list(listed, column)
    if listed is not None and not isinstance(listed, list):
        listed = [listed]
    return listed or []


def _place_listed_images(messages: list[dict[str, Any]], listed: list[Any], column: str) -> None:
    """Put an image part (ref None: taken from the column, in order) where each image of the column goes."""
    placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if isinstance(m["content"], str))
    if placeholders == 0:
        # No placeholder: the images go in front of the first user turn's text (the common convention).
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            raise RowError(IMAGE_MISMATCH, column, "has images but the row has no user turn to put them in")
        if isinstance(first["content"], str):
            first["content"] = IMAGE_PLACEHOLDER * len(listed) + first["content"]
        else:
            first["content"] = [{"type": "image", "ref": None} for _ in listed] + first["content"]
    elif placeholders != len(listed):
        raise RowError(
            IMAGE_MISMATCH,
            column,
            f"has {len(listed)} image(s) but the text has {placeholders} "
            f"{IMAGE_PLACEHOLDER} placeholder(s); make the counts equal",
        )
    for m in messages:
        if isinstance(m["content"], str) and IMAGE_PLACEHOLDER in m["content"]:
            m["content"] = _split_at_placeholders(m["content"])


def _split_at_placeholders(text: str) -> list[dict[str, Any]]:
    """Text with image placeholders as parts: the text between them, an image part (ref None) for each."""
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if k:
            parts.append({"type": "image", "ref": None})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _collect_image_refs(
    messages: list[dict[str, Any]], listed: list[Any], column: str, base_dir: Path | None
) -> list[ImageRef]:
    """Each image part's reference, in order of appearance, leaving the part exactly {"type": "image"}."""
    refs: list[ImageRef] = []
    from_column = iter(enumerate(listed))
    for m in messages:
        if not isinstance(m["content"], list):
            continue
        for part in m["content"]:
            if part["type"] != "image":
                continue
            if part.get("ref") is None:
                k, raw = next(from_column)
                field_name = f"{column}[{k}]"
            else:
                raw, field_name = part["ref"], part["field"]
            refs.append(parse_image_ref(raw, base_dir, field_name))
            part.clear()
            part["type"] = "image"
    return refs


def _as_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def _check_conversation(
    messages: list[dict[str, Any]],
    fields: list[tuple[str, str]],
    columns: ColumnNames,
    fmt: str,
    require_assistant: bool,
) -> None:
    """Skip a row with nothing to train, an empty answer or an empty prompt (a user turn without text or image)."""
    where = columns["messages"] if fmt == "messages" else columns["conversations"] if fmt == "sharegpt" else ""
    if require_assistant and not any(m["role"] == "assistant" for m in messages):
        raise RowError(
            NO_ASSISTANT,
            where or columns["output"],
            'has no assistant turn, so nothing would be trained; add one or set data.train_on = "all"',
        )
    for m, (_, content_field) in zip(messages, fields, strict=True):
        empty = not _as_text(m["content"]).strip()
        if m["role"] == "assistant" and empty and not m.get("tool_calls"):
            raise RowError(EMPTY_CONTENT, content_field, "the assistant turn is empty")
        if m["role"] == "user" and empty and not _has_image(m["content"]):
            raise RowError(
                EMPTY_CONTENT,
                content_field,
                "the user turn is empty, so the answer would follow no question; fill it in or remove the row",
            )


def _has_image(content: str | list[dict[str, Any]]) -> bool:
    return isinstance(content, list) and any(p["type"] == "image" for p in content)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}
    return names.get(type(value), f"a {type(value).__name__}")


def flatten_text_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose list-of-text-parts content is joined into one string (for text-only templates)."""
    out = []
    for m in messages:
        if isinstance(m["content"], list):
            m = {**m, "content": _as_text(m["content"])}
        out.append(m)
    return out

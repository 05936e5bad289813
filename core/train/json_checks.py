"""A run folder's small JSON files (run.json, a checkpoint's state.json) read as input that may be damaged.

A disk error, a copy cut short, an editor or a hostile hand can leave such a file as anything: no regular file (a
FIFO would block the reader), too large, not UTF-8, not JSON, nested past the parser's depth, not an object, or an
object whose fields have another type or range. `read_object` and `field_problems` say each in words naming the
field and the value, for the caller to put after the file's name. Stdlib only: the run history reads run.json
without torch.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hone.core.events import json_kind, quoted

# The last second every platform's time functions can show (9999-12-31 23:59:59 UTC): a time past it is no time.
LATEST_TIME = 253402300799.0

Rule = Callable[[Any], str]  # a field's check: "" when the value is fine, else why not ("not text")


class Damaged(ValueError):
    """A file that cannot be read as the JSON object it should hold. The message says why without the file's name
    ("is not UTF-8 text (byte 0xff at offset 92)"): the caller puts the file first."""


def read_object(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object `path` holds; None when there is no such file. Never opens what is not a regular file, never
    reads more than `max_bytes`.

    Raises:
        Damaged: the file cannot be read, is no regular file, is larger than `max_bytes`, is not UTF-8, is not JSON,
            or holds another JSON value than an object.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Damaged(f"cannot be read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise Damaged("is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO blocks until a writer comes, a device never ends
        raise Damaged("is not a regular file")
    too_large = f"is {st.st_size:,} bytes, more than the {max_bytes:,} it can take"
    if st.st_size > max_bytes:
        raise Damaged(too_large)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)  # it may have grown since
    except OSError as e:
        raise Damaged(f"cannot be read: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise Damaged(too_large)
    return parse_object(raw)


def parse_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw` (UTF-8). Raises Damaged, saying why, when it is none."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Damaged(f"is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise Damaged(f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except ValueError as e:  # an integer of more digits than Python reads
        raise Damaged(f"is not valid JSON ({e})") from None
    except RecursionError:
        raise Damaged("is JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise Damaged(f"holds a JSON {json_kind(data)}, not an object")
    return data


# ---- rules for fields ----


def count(value: Any) -> str:
    """A whole number of at least 0 (a step, a position, a size)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "not a whole number"
    return "below 0" if value < 0 else ""


def text(value: Any) -> str:
    return "" if isinstance(value, str) else "not text"


def finite(value: Any) -> str:
    """A finite number (a loss); an int will do."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    return "" if math.isfinite(value) else "not a finite number"


def moment(value: Any) -> str:
    """Seconds since the epoch that a clock can show."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= LATEST_TIME
    return "" if ok else "not a time"  # NaN fails the comparison too


def an_object(value: Any) -> str:
    return "" if isinstance(value, dict) else "not an object"


def a_list(value: Any) -> str:
    return "" if isinstance(value, list) else "not a list"


def flag(value: Any) -> str:
    return "" if isinstance(value, bool) else "not true or false"


def optional(rule: Rule) -> Rule:
    """`rule`, or null."""
    return lambda value: "" if value is None else rule(value)


def one_of(choices: tuple[str, ...]) -> Rule:
    def rule(value: Any) -> str:
        if not isinstance(value, str):
            return "not text"
        return "" if value in choices else f"not one of {', '.join(choices)}"

    return rule


def field_problems(
    data: dict[str, Any], rules: dict[str, Rule], required: tuple[str, ...] = (), prefix: str = ""
) -> list[str]:
    """What is wrong with the fields of `data` that `rules` name, in the rules' order: "step is 'abc', not a whole
    number", "model is missing" (for a `required` one). Keys without a rule are not looked at (a newer Hone's).
    `prefix` goes before each name ("layout.")."""
    out = []
    for name, rule in rules.items():
        if name not in data:
            if name in required:
                out.append(f"{prefix}{name} is missing")
            continue
        why = rule(data[name])
        if why:
            out.append(f"{prefix}{name} is {quoted(data[name])}, {why}")
    return out

"""A small JSON Schema checker for GRPO's json reward: the keywords structured-output schemas use.

Supported: type (one or a list), enum, const, properties, required, additionalProperties (bool or schema), items,
minItems, maxItems, uniqueItems, minLength, maxLength, pattern, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, anyOf, allOf, oneOf, not. Other keywords ($ref, formats, …) are not checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hone.core.errors import ConfigError

# A schema file is a few KB; a larger one is almost certainly the wrong file.
MAX_SCHEMA_BYTES = 1 << 20
# Nesting checked at most: deeper values are judged not to conform (no recursion without end).
MAX_DEPTH = 64
# Time limit of a schema's `pattern` on one string (see rewards.REGEX_TIMEOUT_S).
PATTERN_TIMEOUT_S = 0.5

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def load_schema(given: str | dict) -> dict:
    """A schema from a dict, inline JSON text (starting with "{"), or the path of a JSON file."""
    if isinstance(given, dict):
        return given
    text, where = given, "inline"
    if not given.lstrip().startswith("{"):
        path = Path(given)
        if not path.is_file():
            raise ConfigError(f"JSON schema file {path} does not exist", "give a file path or the schema inline")
        if path.stat().st_size > MAX_SCHEMA_BYTES:
            raise ConfigError(f"JSON schema file {path} is over 1 MiB", "give the schema file, not a data file")
        text, where = path.read_text(encoding="utf-8"), str(path)
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"the JSON schema ({where}) is not valid JSON: {e}", "fix the schema") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"the JSON schema ({where}) is not an object", 'a schema is an object: {"type": ...}')
    return schema


def _pattern_matches(pattern: str, text: str) -> bool:
    import regex  # time-limited matching (see rewards.regex_match)

    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except (TimeoutError, regex.error, re.error):
        return False


def _check_number(value: Any, schema: dict) -> bool:
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if "maximum" in schema and value > schema["maximum"]:
        return False
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return False
    return not ("exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"])


def _check_string(value: str, schema: dict) -> bool:
    if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
        return False
    return "pattern" not in schema or _pattern_matches(schema["pattern"], value)


def _check_array(value: list, schema: dict, depth: int) -> bool:
    if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
        return False
    if schema.get("uniqueItems"):
        seen = [json.dumps(v, sort_keys=True) for v in value]
        if len(set(seen)) < len(seen):
            return False
    items = schema.get("items")
    return not isinstance(items, dict) or all(_conforms(v, items, depth + 1) for v in value)


def _check_object(value: dict, schema: dict, depth: int) -> bool:
    if any(key not in value for key in schema.get("required", [])):
        return False
    properties = schema.get("properties", {})
    for key, item in value.items():
        if key in properties:
            if not _conforms(item, properties[key], depth + 1):
                return False
            continue
        extra = schema.get("additionalProperties", True)
        if extra is False or (isinstance(extra, dict) and not _conforms(item, extra, depth + 1)):
            return False
    return True


def _check_combinators(value: Any, schema: dict, depth: int) -> bool:
    if "allOf" in schema and not all(_conforms(value, s, depth + 1) for s in schema["allOf"]):
        return False
    if "anyOf" in schema and not any(_conforms(value, s, depth + 1) for s in schema["anyOf"]):
        return False
    if "oneOf" in schema and sum(_conforms(value, s, depth + 1) for s in schema["oneOf"]) != 1:
        return False
    return not ("not" in schema and _conforms(value, schema["not"], depth + 1))


def _conforms(value: Any, schema: Any, depth: int) -> bool:
    if schema is True or schema == {}:
        return True
    if schema is False or not isinstance(schema, dict) or depth > MAX_DEPTH:
        return False
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda v: False)(value) for k in kinds):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if _TYPES["number"](value) and not _check_number(value, schema):
        return False
    if isinstance(value, str) and not _check_string(value, schema):
        return False
    if isinstance(value, list) and not _check_array(value, schema, depth):
        return False
    if isinstance(value, dict) and not _check_object(value, schema, depth):
        return False
    return _check_combinators(value, schema, depth)


def conforms(value: Any, schema: dict) -> bool:
    """Whether the JSON `value` conforms to `schema` (the keywords above)."""
    return _conforms(value, schema, 0)

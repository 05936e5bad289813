"""How one answer is scored against its reference, beyond exact match and word F1 (hone.core.inference.evaluate).

    normalized match  the same words once case, punctuation and runs of whitespace are ignored
    JSON validity     the answer parses as JSON; counted only over rows whose reference is JSON (an object or a list)
    contains          the reference, normalized, appears inside the answer, normalized

`answer_metrics` gives the shares of a model's answers over a set of rows. Stdlib only.
"""

from __future__ import annotations

import json
import re
import string

from hone.core.inference.evaluate import word_f1

_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")
_SPACE = re.compile(r"\s+")


def normalized(text: str) -> str:
    """`text` lowercased, punctuation removed, whitespace runs made one space, the ends trimmed."""
    return _SPACE.sub(" ", _PUNCTUATION.sub(" ", text.lower())).strip()


def exact_match(answer: str, reference: str) -> bool:
    """The same text once whitespace at the ends is ignored (`hone eval`'s exact match)."""
    return answer.strip() == reference.strip()


def normalized_match(answer: str, reference: str) -> bool:
    return normalized(answer) == normalized(reference)


def contains(answer: str, reference: str) -> bool:
    """The normalized reference appears in the normalized answer (an empty reference is in no answer)."""
    want = normalized(reference)
    return bool(want) and f" {want} " in f" {normalized(answer)} "


def json_reference(reference: str) -> bool:
    """Whether a reference is a JSON object or list: only then is an answer's JSON validity counted."""
    try:
        return isinstance(json.loads(reference), (dict, list))
    except ValueError:  # json.JSONDecodeError, and integers of more digits than Python reads
        return False


def json_valid(answer: str) -> bool:
    """The answer, whitespace at the ends ignored, is one JSON value."""
    try:
        json.loads(answer.strip())
    except (ValueError, RecursionError):
        return False
    return True


def answer_metrics(answers: list[str], references: list[str]) -> dict[str, float | None]:
    """The shares (0..1) of `answers` that match their `references` exactly, after normalizing, that contain them,
    and their mean word F1; "json_valid" is the share of valid JSON among the answers to JSON references (None when
    no reference is JSON)."""
    if len(answers) != len(references):
        raise ValueError(f"{len(answers)} answers for {len(references)} references")
    n = max(len(answers), 1)
    pairs = list(zip(answers, references, strict=True))
    json_rows = [a for a, r in pairs if json_reference(r)]
    return {
        "exact": sum(exact_match(a, r) for a, r in pairs) / n,
        "normalized": sum(normalized_match(a, r) for a, r in pairs) / n,
        "f1": sum(word_f1(a, r) for a, r in pairs) / n,
        "contains": sum(contains(a, r) for a, r in pairs) / n,
        "json_valid": sum(json_valid(a) for a in json_rows) / len(json_rows) if json_rows else None,
    }

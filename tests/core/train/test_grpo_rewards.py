"""GRPO's rewards: the built-ins, weights, a user's reward file, and rewards that fail on one sample."""

from __future__ import annotations

import json
import math
import time

import pytest

from hone.core.errors import ConfigError
from hone.core.train.json_schema import conforms
from hone.core.train.rewards import Sample, build_rewards, last_number, score_samples


def _sample(completion: str, tokens: int = 5, **row) -> Sample:
    return Sample(completion=completion, prompt="Q?", row=row, completion_tokens=tokens, source="train.jsonl:3")


@pytest.mark.parametrize(
    ("text", "number"),
    [("so the answer is 1,234.50 dollars", 1234.5), ("#### 72", 72.0), ("-3 then $-4.25", -4.25), ("none", None)],
)
def test_last_number(text, number):
    assert last_number(text) == number


def test_builtins_and_weights():
    rewards = build_rewards(
        [
            {"kind": "numeric", "column": "answer", "weight": 2.0},
            {"kind": "exact", "column": "label"},
            {"kind": "regex", "pattern": r"^<think>.*</think>", "weight": 0.5},
            {"kind": "length", "target": 10, "weight": 1.0},
        ]
    )
    samples = [
        _sample("<think>6*7</think> The answer is 42.", tokens=12, answer="#### 42", label="x"),
        _sample("x", tokens=3, answer="41", label="x"),
    ]
    scores = score_samples(rewards, samples)
    assert scores.by_reward == {
        "numeric:answer": [1.0, 0.0],
        "exact:label": [0.0, 1.0],
        "regex": [1.0, 0.0],
        "length": [-0.2, 0.0],
    }
    assert scores.total == pytest.approx([2.0 + 0.5 - 0.2, 1.0])
    assert scores.problems == [] and scores.failed == 0


def test_json_reward_with_a_schema_file(tmp_path):
    schema = {
        "type": "object",
        "required": ["name", "age"],
        "properties": {"name": {"type": "string", "minLength": 1}, "age": {"type": "integer", "minimum": 0}},
        "additionalProperties": False,
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    [plain, with_schema] = build_rewards([{"kind": "json"}, {"kind": "json", "schema": str(path)}])
    good = '```json\n{"name": "Ada", "age": 36}\n```'
    assert with_schema.score(_sample(good)) == 1.0
    assert with_schema.score(_sample('{"name": "Ada", "age": -1}')) == 0.5  # JSON, but not the schema's
    assert with_schema.score(_sample('{"name": "Ada"')) == 0.0
    assert plain.score(_sample('{"anything": [1, 2]}')) == 1.0
    assert plain.score(_sample("[" * 100_000)) == 0.0  # too deep for the parser: not JSON, no crash


def test_schema_checker_keywords():
    schema = {
        "type": "array",
        "items": {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}]},
        "minItems": 1,
        "uniqueItems": True,
    }
    assert conforms(["ab", None], schema)
    assert not conforms([], schema)
    assert not conforms(["ab", "ab"], schema)
    assert not conforms(["AB"], schema)
    assert conforms({"k": 1.0}, {"type": "object", "additionalProperties": {"type": "integer"}})
    assert not conforms({"k": True}, {"type": "object", "additionalProperties": {"type": "integer"}})
    assert conforms(3, {"oneOf": [{"minimum": 2}, {"maximum": 1}]})
    assert not conforms("x", {"not": {"type": "string"}})
    assert not conforms(5, {"enum": [1, 2]}) and conforms(2, {"const": 2})


def test_a_raising_user_function_skips_only_its_sample(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def brevity(completion, prompt, row):\n"
        "    if row['answer'] == 'boom':\n"
        "        raise RuntimeError('cannot score this one')\n"
        "    return 1.0 / (1 + len(completion))\n"
        "def nothing(completion, prompt, row):\n"
        "    return 'not a number'\n"
    )
    rewards = build_rewards([{"kind": "python", "function": "brevity"}], reward_file=str(path))
    scores = score_samples(rewards, [_sample("abc", answer="ok"), _sample("abcd", answer="boom")])
    assert scores.total[0] == pytest.approx(0.25) and math.isnan(scores.total[1])
    assert scores.failed == 1
    assert scores.problems == ["reward brevity on row train.jsonl:3: RuntimeError: cannot score this one"]
    bad = build_rewards([{"kind": "python", "function": "nothing"}], reward_file=str(path))
    assert "not a finite number" in score_samples(bad, [_sample("x", answer="ok")]).problems[0]
    with pytest.raises(ConfigError, match="no function 'missing'"):
        build_rewards([{"kind": "python", "function": "missing"}], reward_file=str(path))


def test_a_missing_column_is_reported_with_the_row():
    scores = score_samples(build_rewards([{"kind": "numeric", "column": "solution"}]), [_sample("7", answer="7")])
    assert math.isnan(scores.total[0])
    assert "row train.jsonl:3" in scores.problems[0] and "no column 'solution'" in scores.problems[0]


def test_a_hostile_regex_is_stopped_and_reported():
    # backtracks through every split of the text into five groups: minutes with the re module
    rewards = build_rewards([{"kind": "regex", "pattern": r"(.*)(.*)(.*)(.*)(.*)\1\2\3\4\5z"}, {"kind": "json"}])
    started = time.perf_counter()
    scores = score_samples(rewards, [_sample("ab" * 200 + "!z"), _sample('{"a": 1}')])
    assert time.perf_counter() - started < 3
    assert math.isnan(scores.total[0]) and scores.total[1] == 1.0
    assert "TimeoutError" in scores.problems[0]

"""GRPO's rewards: built-ins picked in the config ([grpo] rewards) and a user's own Python function.

Each reward scores one sampled completion of one dataset row; the rewards' weighted sum is the completion's reward.
Built-ins (each a table in `grpo.rewards`, `kind` naming it, `weight` 1.0 unless given):

- exact: 1.0 when the completion, stripped, equals the row's `column` (default "answer"), else 0.0.
- numeric: 1.0 when the last number in the completion equals the last number in `column` (commas, currency and
  units around it ignored: "$1,234.50" is 1234.5; GSM8K's "#### 72" is 72), else 0.0.
- regex: 1.0 when `pattern` matches anywhere in the completion (`fullmatch = true`: the whole of it), else 0.0.
  Matching runs with a time limit, so a pattern that backtracks without end fails that sample, not the run.
- json: 1.0 when the completion (or a ```json fenced block in it) is valid JSON; with `schema` (a file path or
  inline JSON) 1.0 only when it also conforms, 0.5 when it is JSON that does not (`json_schema.py`).
- length: 0 up to `target` completion tokens, then -(tokens - target) / target.
- python: `function` from the file `grpo.reward_file`, called as function(completion=str, prompt=str, row=dict)
  and returning a number (None: not scored). This runs the user's code; it is loaded only when a config names it.

A reward that raises (or returns something that is not a finite number) is reported with its row, and that
sample's reward is NaN: it is left out of its group's statistics (advantage 0), and the run goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hone.core.config import REWARD_KEYS
from hone.core.errors import ConfigError
from hone.core.train.json_schema import conforms, load_schema

# Longest a regex may search one completion: a completion is at most a few thousand tokens, which any sane pattern
# matches in well under a millisecond; a catastrophically backtracking one is stopped here.
REGEX_TIMEOUT_S = 0.5
# Problems reported per step (the rest are counted): enough to show which row and reward fail, not a flood.
MAX_REPORTED = 5
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
FENCED_JSON = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Sample:
    """One completion to score: its text, its prompt as text, the dataset row's columns, its token count, and where
    the row came from (file:line, for reports)."""

    completion: str
    prompt: str
    row: Mapping[str, Any]
    completion_tokens: int
    source: str = ""


@dataclass(frozen=True)
class Reward:
    """One weighted reward: `score(sample)` gives a float (or raises)."""

    name: str
    weight: float
    score: Callable[[Sample], float | None]


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands separators allowed), or None."""
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def _column(sample: Sample, column: str) -> Any:
    if column not in sample.row:
        raise KeyError(f"the row has no column {column!r} (columns: {', '.join(map(str, sample.row)) or 'none'})")
    return sample.row[column]


def exact_match(column: str) -> Callable[[Sample], float]:
    def score(sample: Sample) -> float:
        return float(sample.completion.strip() == str(_column(sample, column)).strip())

    return score


def numeric_match(column: str) -> Callable[[Sample], float]:
    def score(sample: Sample) -> float:
        value = _column(sample, column)
        expected = float(value) if isinstance(value, (int, float)) else last_number(str(value))
        if expected is None:
            raise ValueError(f"column {column!r} holds no number: {str(value)[:80]!r}")
        got = last_number(sample.completion)
        return float(got is not None and abs(got - expected) <= 1e-6 * max(1.0, abs(expected)))

    return score


def regex_match(pattern: str, fullmatch: bool = False) -> Callable[[Sample], float]:
    import regex  # transformers' own dependency; unlike re, it can stop a match after a time limit

    compiled = regex.compile(pattern, regex.DOTALL)
    match = compiled.fullmatch if fullmatch else compiled.search

    def score(sample: Sample) -> float:
        try:
            return float(match(sample.completion, timeout=REGEX_TIMEOUT_S) is not None)
        except TimeoutError:
            raise TimeoutError(f"the pattern took over {REGEX_TIMEOUT_S} s on this completion") from None

    return score


def json_valid(schema: dict | None = None) -> Callable[[Sample], float]:
    def score(sample: Sample) -> float:
        text = sample.completion.strip()
        fenced = FENCED_JSON.search(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except (ValueError, RecursionError):
            return 0.0
        if schema is None:
            return 1.0
        return 1.0 if conforms(value, schema) else 0.5

    return score


def length_penalty(target: int) -> Callable[[Sample], float]:
    def score(sample: Sample) -> float:
        return -max(0, sample.completion_tokens - target) / target

    return score


def load_user_function(path: str | Path, name: str) -> Callable[..., Any]:
    """`name` from the Python file `path` (executing the file: the user's own code)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grpo.reward_file {path} does not exist", "give the path of a Python file")
    spec = importlib.util.spec_from_file_location(f"hone_user_rewards_{abs(hash(str(path.resolve())))}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"grpo.reward_file {path} cannot be loaded as Python", "give a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"grpo.reward_file {path} failed to load: {type(e).__name__}: {e}", "fix the file") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(
            f"grpo.reward_file {path} has no function {name!r}", f"functions in it: {', '.join(found) or 'none'}"
        )
    return fn


def _user_reward(fn: Callable[..., Any]) -> Callable[[Sample], float | None]:
    def score(sample: Sample) -> float | None:
        return fn(completion=sample.completion, prompt=sample.prompt, row=dict(sample.row))

    return score


def build_reward(spec: Mapping[str, Any], reward_file: str = "") -> Reward:
    """One Reward from a `grpo.rewards` table (checked by GrpoConfig)."""
    kind = spec["kind"]
    column = str(spec.get("column", "answer"))
    if kind == "exact":
        score, label = exact_match(column), f"exact:{column}"
    elif kind == "numeric":
        score, label = numeric_match(column), f"numeric:{column}"
    elif kind == "regex":
        score, label = regex_match(spec["pattern"], bool(spec.get("fullmatch", False))), "regex"
    elif kind == "json":
        schema = load_schema(spec["schema"]) if spec.get("schema") else None
        score, label = json_valid(schema), "json" if schema is None else "json_schema"
    elif kind == "length":
        score, label = length_penalty(int(spec["target"])), "length"
    elif kind == "python":
        score, label = _user_reward(load_user_function(reward_file, spec["function"])), spec["function"]
    else:
        raise ConfigError(f"grpo.rewards: unknown kind {kind!r}", f"kinds are {', '.join(REWARD_KEYS)}")
    return Reward(str(spec.get("name", label)), float(spec.get("weight", 1.0)), score)


def build_rewards(specs: list[Mapping[str, Any]], reward_file: str = "") -> list[Reward]:
    """The run's rewards, names made unique (a second "regex" is "regex_2")."""
    rewards, seen = [], set()
    for spec in specs:
        reward = build_reward(spec, reward_file)
        name, k = reward.name, 2
        while name in seen:
            name, k = f"{reward.name}_{k}", k + 1
        seen.add(name)
        rewards.append(Reward(name, reward.weight, reward.score))
    return rewards


@dataclass
class Scores:
    """Per sample: the weighted total (NaN when a reward failed on it) and each reward's value; problems reported."""

    total: list[float]
    by_reward: dict[str, list[float]]
    problems: list[str] = field(default_factory=list)
    failed: int = 0


def score_samples(rewards: list[Reward], samples: list[Sample]) -> Scores:
    """Every reward on every sample; a reward that raises or returns a non-number fails only that sample."""
    scores = Scores([0.0] * len(samples), {r.name: [math.nan] * len(samples) for r in rewards})
    for i, sample in enumerate(samples):
        for reward in rewards:
            try:
                value = reward.score(sample)
                if value is None:  # the reward chose not to score this sample
                    scores.total[i] = math.nan
                    continue
                if not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise TypeError(f"returned {value!r}, not a finite number")
            except Exception as e:  # the reward's problem (or the user's code): this sample only
                scores.failed += 1
                scores.total[i] = math.nan
                if len(scores.problems) < MAX_REPORTED:
                    where = f" on row {sample.source}" if sample.source else ""
                    scores.problems.append(f"reward {reward.name}{where}: {type(e).__name__}: {e}")
                continue
            scores.by_reward[reward.name][i] = float(value)
            scores.total[i] += reward.weight * float(value)
    return scores

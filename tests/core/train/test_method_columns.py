"""The Monitor's column reader reads every line as the engine's MetricsReader does (damaged lines, other events,
values of every form), its float parse equals float() value for value, and it adds the methods' columns."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from hone.core.api import MetricsReader, StepColumns
from hone.core.events import Notice, RunFailed, StepMetrics, to_dict
from hone.core.train.json_floats import WIDTH, json_floats
from hone.core.train.method_columns import METHOD_FIELDS, MethodColumnsReader, StepBlock

JSON_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?\Z")
COLUMNS = ("step", "time", "loss", "lr", "tokens_per_s", "mem_allocated", "mem_reserved", "mem_by_gpu", "expert_load")


def _parse(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    text = np.zeros((len(texts), WIDTH), np.uint8)
    for i, t in enumerate(texts):
        text[i, : len(t)] = np.frombuffer(t.encode(), np.uint8)
    return json_floats(text, np.array([len(t) for t in texts]))


def _texts() -> list[str]:
    rng = np.random.default_rng(0)
    values = [
        *rng.uniform(0, 3, 20_000),
        *(np.exp(rng.uniform(-300, 300, 20_000)) * rng.choice([-1, 1], 20_000)),
        *rng.standard_normal(10_000).astype(np.float32).astype(float),
        *map(float, rng.integers(0, 2**62, 2000)),
    ]
    texts = [repr(float(v)) for v in values] + [str(v) for v in rng.integers(-(2**62), 2**62, 2000).tolist()]
    for _ in range(20_000):  # decimal strings of any length up to the field's, dot and exponent anywhere
        digits = "".join(rng.choice(list("0123456789"), rng.integers(1, 20))).lstrip("0") or "0"
        if len(digits) > 1 and rng.random() < 0.6:
            cut = int(rng.integers(1, len(digits)))
            digits = digits[:cut] + "." + digits[cut:]
        if rng.random() < 0.4:
            digits += str(rng.choice(["e", "E"])) + str(rng.choice(["", "+", "-"])) + str(rng.integers(0, 40))
        texts.append(digits[:WIDTH])
    return texts


def test_json_floats_equal_float_for_every_json_number_and_refuse_the_rest():
    texts = [
        *_texts(),
        "0", "-0", "0.0", "-0.0", "1e5", "1E+5", "1e-5", "5e-324", "1e308", "1.7976931348623157e+308",
        "2.2250738585072014e-308", "9007199254740993", "123456789012345678901234", "0.30000000000000004",
    ]  # fmt: skip
    rng = np.random.default_rng(1)
    texts += ["".join(rng.choice(list("0123456789.eE+-"), rng.integers(1, WIDTH + 1))) for _ in range(30_000)]
    texts += ["05", ".5", "5.", "-", "1e", "1e+", "nan", "NaN", "inf", "Infinity", "1_0", "+5", " 5", "0x10", "1.e5"]
    values, ok = _parse(texts)
    valid = np.array([bool(JSON_NUMBER.match(t)) for t in texts])
    assert not (ok & ~valid).any(), [t for t, k, v in zip(texts, ok, valid) if k and not v][:5]
    expected = np.array([float(t) if v else 0.0 for t, v in zip(texts, valid)])
    assert np.array_equal(values[ok], expected[ok]) and np.array_equal(np.signbit(values[ok]), np.signbit(expected[ok]))
    assert ok[valid].mean() > 0.99, "only exponents beyond the table, and values near a halfway point, go the slow way"


def _line(fields: dict) -> str:
    return json.dumps(fields)


def _damaged_file(path) -> None:
    """Step lines of a preference run with every kind of damage and oddity between them."""
    base = to_dict(
        StepMetrics(
            step=1, total_steps=99, epoch=0.1, loss=2.5, lr=1e-4, grad_norm=1.0, tokens=10, trained_tokens=5,
            tokens_per_s=1000.0, step_time=0.1, elapsed=0.1, mem_allocated=2**30, mem_reserved=2**31, time=1.79e9,
            reward_margin=0.25, reward_accuracy=0.75, chosen_logps=-50.5, rejected_logps=-60.25,
        )
    )  # fmt: skip
    lines = []
    rng = np.random.default_rng(2)
    for s in range(1, 200):
        fields = {**base, "step": s, "time": 1.79e9 + s * 0.5, "loss": float(rng.uniform(0, 3))}
        fields["reward_margin"] = float(rng.normal())
        lines.append(_line(fields))
    odd_values = ["null", "NaN", "Infinity", "-Infinity", "1e400", "-0.0", "1E5", '"x"', "true", "[1]", "{}", "1_0",
                  "inf", "+5", "05", ".5", "1e", "12345678901234567890123456", "9007199254740993"]  # fmt: skip
    for k, value in enumerate(odd_values):
        for name in ("loss", "reward_margin", "step", "mem_allocated"):
            text = _line({**base, "step": 300 + k})
            lines.append(re.sub(rf'"{name}": [^,]+,', f'"{name}": {value},', text, count=1))
    lines += [
        _line({**base, "step": 400})[:-20],  # cut short
        "not json at all",
        _line({**base, "step": 401}).replace("StepMetrics", "StepMetricz"),
        json.dumps(to_dict(Notice(topic="memory", message="re-planned", step=3))),
        json.dumps({**to_dict(RunFailed(reason="x")), "reason": 5}),
        _line({**base, "step": 402, "extra_key": 1}),  # a newer version's field
        _line({k: v for k, v in base.items() if k != "reward_accuracy"} | {"step": 403}),
        _line({**base, "step": 2**60}),
        _line({**base, "step": 404, "mem_by_gpu": [1, 2], "expert_load": [3, 4, 5]}),
        _line({**base, "step": 405, "mem_by_gpu": [1, "x"]}),
        _line({**base, "step": 406, "rewards": {"a": 1.0}, "reward_mean": 0.5}),
        _line({**base, "step": 407}).replace(", ", ",  ", 3),
        "",
        "[]",
    ]
    data = "\n".join(lines).encode() + b"\n" + b'{"event": "StepMetrics", "step": \xff\xfe}\n'
    path.write_bytes(data + _line({**base, "step": 500}).encode() + b"\n")


def _same(old: list, new: list) -> None:
    assert len(old) == len(new)
    for a, b in zip(old, new):
        if isinstance(a, StepColumns):
            assert isinstance(b, StepBlock)
            for name in COLUMNS:
                assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
            assert a.last == b.last and a.experts_changed == b.experts_changed
        else:
            assert a == b


def test_the_monitor_reader_reads_a_damaged_file_as_the_engine_reader_does(tmp_path):
    _damaged_file(tmp_path / "metrics.jsonl")
    old, new = MetricsReader(tmp_path), MethodColumnsReader(tmp_path)
    _same(old.read(), new.read())
    assert (new.lines, new.skipped, new.first_skipped) == (old.lines, old.skipped, old.first_skipped)
    assert new.skipped > 10


def test_the_method_columns_hold_each_steps_values(tmp_path):
    """A preference run's lines (some leaving a field out, one null, one not a number), then GRPO lines with their
    rewards: each step's method values in its columns, NaN where its line has none."""
    rng = np.random.default_rng(5)
    written = []
    for s in range(1, 300):
        fields: dict = {"reward_margin": float(rng.normal()), "reward_accuracy": float(rng.uniform())}
        if s % 7:
            fields |= {"chosen_logps": float(-rng.uniform(10, 90)), "rejected_logps": float(-rng.uniform(10, 90))}
        if s > 250:
            fields = {"reward_mean": float(rng.uniform()), "reward_std": 0.5, "kl": 0.01, "rewards": {"r": s / 1000}}
        event = StepMetrics(
            step=s, total_steps=299, epoch=0.0, loss=1.0, lr=1e-4, grad_norm=1.0, tokens=10, trained_tokens=5,
            tokens_per_s=1.0, step_time=0.1, elapsed=0.1, time=1.79e9 + s, **fields,
        )  # fmt: skip
        line = json.dumps(to_dict(event))
        if s == 100:
            line = re.sub(r'"reward_margin": [^,]+', '"reward_margin": null', line)
            fields = {**fields, "reward_margin": None}
        if s == 101:  # not a number: the engine's reader takes the line by position all the same
            line = re.sub(r'"reward_accuracy": [^,]+', '"reward_accuracy": "high"', line)
            fields = {**fields, "reward_accuracy": None}
        written.append((s, fields, line))
    (tmp_path / "metrics.jsonl").write_text("".join(line + "\n" for _, _, line in written))
    blocks = [item for item in MethodColumnsReader(tmp_path).read() if isinstance(item, StepBlock)]
    assert np.concatenate([b.step for b in blocks]).tolist() == [s for s, _, _ in written]
    for name in METHOD_FIELDS:
        column = np.concatenate([b.method[name] for b in blocks])
        assert [None if math.isnan(v) else v for v in column.tolist()] == [f.get(name) for _, f, _ in written], name
    rewards = np.concatenate([b.rewards.get("r", np.full(len(b), np.nan)) for b in blocks]).tolist()
    assert [None if math.isnan(v) else v for v in rewards] == [f.get("rewards", {}).get("r") for _, f, _ in written]


@pytest.mark.parametrize("chunk", [1 << 10, 8 << 20])
def test_handing_over_each_chunk_gives_what_one_read_gives(tmp_path, monkeypatch, chunk):
    from hone.core.train import metrics_series

    _damaged_file(tmp_path / "metrics.jsonl")
    monkeypatch.setattr(metrics_series, "CHUNK_BYTES", chunk)  # many chunks: lines cut across them
    whole = MetricsReader(tmp_path).read()
    handed: list = []
    MethodColumnsReader(tmp_path).read_into(handed.extend)
    steps = lambda items: np.concatenate([i.step for i in items if isinstance(i, StepColumns)])  # noqa: E731
    assert np.array_equal(steps(whole), steps(handed))
    assert [i for i in whole if not isinstance(i, StepColumns)] == [i for i in handed if not isinstance(i, StepColumns)]

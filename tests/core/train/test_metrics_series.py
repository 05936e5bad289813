"""The Monitor's column reader of metrics.jsonl: the same numbers events.from_line reads, damaged lines skipped and
counted (never raised), appended lines read once; and the thinning of a series for drawing."""

from __future__ import annotations

import json
import math

import numpy as np

from hone.core.config import RunConfig
from hone.core.events import EvalMetrics, Notice, RunFinished, RunStarted, StepMetrics, to_dict
from hone.core.train.metrics_series import DRAWN_POINTS, EXACT_TAIL, MetricsReader, StepColumns, downsample
from hone.core.train.run_dir import EventTail, RunWriter

GIB = 2**30


def _step(s: int, t0: float, **changes) -> StepMetrics:
    rng = np.random.default_rng(s)
    fields = dict(
        step=s,
        total_steps=40,
        epoch=s / 40,
        loss=float(3.0 / s + rng.uniform(0, 0.3)),  # 16-17 digit floats, as a real loss writes
        lr=2e-4 * (1 - s / 40) + 1e-9,  # below 1e-4 Python writes it as 9.5e-05
        grad_norm=1.0,
        tokens=1000,
        trained_tokens=400,
        tokens_per_s=float(1000 + rng.uniform(0, 1)),
        step_time=0.5,
        elapsed=0.5 * s,
        mem_allocated=s * GIB // 8,
        mem_reserved=2 * GIB,
        time=t0 + 0.5 * s + float(rng.uniform(0, 0.01)),
    )
    return StepMetrics(**{**fields, **changes})


def _run(run_dir, t0):
    steps = [_step(s, t0) for s in range(1, 41)]
    steps[6] = _step(7, t0, loss=math.nan)  # written as null
    steps[10] = _step(11, t0, mem_by_gpu=[3 * GIB, 4 * GIB])
    for s in (20, 21, 22):
        steps[s - 1] = _step(s, t0, expert_load=[s, 1, 2])
    events = [
        Notice(topic="memory", message="fits", step=0, time=t0 - 1),
        RunStarted(
            run_dir=str(run_dir),
            model="tiny",
            device="cpu",
            dtype="float32",
            params_total=10,
            params_trainable=1,
            total_steps=40,
            tokens_per_epoch=100,
            time=t0,
        ),
        *steps[:25],
        EvalMetrics(step=25, loss=1.5, tokens=10, time=t0 + 13),
        *steps[25:],
        RunFinished(step=40, run_dir=str(run_dir), adapter_dir="", final_loss=1.0, elapsed=20.0, time=t0 + 21),
    ]
    writer = RunWriter(run_dir, RunConfig())
    for event in events:
        writer.write(event)
    writer.close()
    return events


def _columns(items) -> dict[str, np.ndarray]:
    blocks = [item for item in items if isinstance(item, StepColumns)]
    names = ("step", "time", "loss", "lr", "tokens_per_s", "mem_allocated", "mem_reserved")
    return {name: np.concatenate([getattr(b, name) for b in blocks]) for name in names}


def test_columns_hold_what_events_from_line_reads(tmp_path):
    run_dir = tmp_path / "run"
    _run(run_dir, 1.79e9)
    reference = EventTail(run_dir).read()
    items = MetricsReader(run_dir).read()
    steps = [e for e in reference if isinstance(e, StepMetrics)]
    columns = _columns(items)
    for name, column in columns.items():
        expected = np.array([float(getattr(s, name)) for s in steps])
        assert np.array_equal(column, expected, equal_nan=True), name  # bit for bit, NaN where null was written
    assert math.isnan(columns["loss"][6]) and columns["lr"][-1] < 1e-4
    # The other events come back as events, between the step blocks, in file order.
    kinds = [type(i).__name__ if not isinstance(i, StepColumns) else f"steps:{len(i)}" for i in items]
    assert kinds == ["Notice", "RunStarted", "steps:25", "EvalMetrics", "steps:15", "RunFinished"]
    assert [i for i in items if not isinstance(i, StepColumns)] == [
        e for e in reference if not isinstance(e, StepMetrics)
    ]
    first, second = (i for i in items if isinstance(i, StepColumns))
    assert first.expert_load.tolist() == [20 + 21 + 22, 3, 6] and not first.experts_changed
    assert second.expert_load.size == 0
    gpus = first.mem_by_gpu
    assert gpus.shape == (25, 2) and gpus[10].tolist() == [3 * GIB, 4 * GIB] and np.isnan(gpus[9]).all()
    assert list(first.last) == steps[5:25] and list(second.last) == steps[25:][-20:]


def test_damaged_lines_are_skipped_and_counted_never_raised(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = [_step(s, 1.79e9) for s in (1, 2, 3)]
    line = [json.dumps(to_dict(s)).encode() for s in good]
    damaged = [
        b"\xff\xfe not text",
        line[0].replace(b'"loss": ', b'"loss": "abc", "x": '),  # loss is text
        line[0].replace(b'"step": 1', b'"step": 1.5'),  # a step that is not whole
        line[0][:120],  # cut short
        b"[1, 2, 3]",
        line[0].replace(b'"time": ', b'"time": 1e999, "t": '),
        b"",
    ]
    with open(run_dir / "metrics.jsonl", "wb") as f:
        f.write(b"\n".join([line[0], *damaged, line[1], b"x" * (5 << 20), line[2]]) + b"\n")
    reader = MetricsReader(run_dir)
    items = reader.read()
    assert _columns(items)["step"].tolist() == [1, 2, 3]
    tail = EventTail(run_dir)
    tail.read()
    assert reader.skipped == tail.skipped == len(damaged) + 1  # and the 5 MB line
    assert reader.lines == tail.lines == 11
    assert reader.skipped_note().startswith("8 lines of metrics.jsonl could not be read (line 2: not UTF-8")


def test_appended_lines_are_read_once_and_a_partial_line_waits(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "metrics.jsonl"
    lines = [json.dumps(to_dict(_step(s, 1.79e9))) + "\n" for s in (1, 2, 3)]
    path.write_text(lines[0])
    reader = MetricsReader(run_dir)
    assert _columns(reader.read())["step"].tolist() == [1]
    with open(path, "a") as f:
        f.write(lines[1] + lines[2][:50])
    assert _columns(reader.read())["step"].tolist() == [2]
    with open(path, "a") as f:
        f.write(lines[2][50:])
    assert _columns(reader.read())["step"].tolist() == [3]
    assert reader.read() == []


def test_downsample_keeps_every_bucket_extreme_and_the_newest_points():
    n = 1_000_000
    rng = np.random.default_rng(0)
    x = np.arange(1, n + 1, dtype=np.float64)
    y = rng.normal(2.0, 0.1, n)
    spikes = rng.choice(np.arange(0, n - 10_000, 2_000), size=40, replace=False)  # far apart: one per bucket at most
    y[spikes[:20]] = 50.0 + np.arange(20)
    y[spikes[20:]] = -50.0 - np.arange(20)
    y[123_456:123_999] = np.nan  # a stretch of steps whose loss was not finite
    dx, dy = downsample(x, y)
    assert len(dx) <= DRAWN_POINTS
    assert np.all(np.diff(dx) > 0), "in order, each point once"
    assert set((50.0 + np.arange(20)).tolist()) <= set(dy.tolist()), "every spike is drawn"
    assert set((-50.0 - np.arange(20)).tolist()) <= set(dy.tolist()), "and every dip"
    assert np.array_equal(dx[-EXACT_TAIL:], x[-EXACT_TAIL:]) and np.array_equal(dy[-EXACT_TAIL:], y[-EXACT_TAIL:])
    index = (dx - 1).astype(int)
    assert np.array_equal(dy, y[index], equal_nan=True), "drawn points are points of the series"
    small_x, small_y = downsample(x[:DRAWN_POINTS], y[:DRAWN_POINTS])
    assert small_x is not None and len(small_x) == DRAWN_POINTS and np.array_equal(small_y, y[:DRAWN_POINTS])


def test_downsample_of_each_bucket_is_its_lowest_and_highest_point():
    x = np.arange(10_000, dtype=np.float64)
    y = np.sin(x / 37.0) * (1 + x / 1000)
    dx, dy = downsample(x, y, max_points=100)
    assert len(dx) <= 100
    # 100 points: the newest 10 exactly, 44 buckets of 228 points (the first one shorter) drawn as 2 points each.
    bucket = (len(x) - 10) // ((100 - 10) // 2 - 1) + 1
    assert bucket == 228
    for start in range(len(x) - 10 - bucket * 40, len(x) - 10, bucket):
        segment = y[start : start + bucket]
        assert segment.min() in dy and segment.max() in dy

"""A run's metrics.jsonl as chart columns for a front end that follows every training method: MetricsReader
(hone.core.train.metrics_series) with the float columns parsed by `json_floats` instead of numpy's cast (about a
second less per million steps, and the window's interpreter lock held far less), the methods' columns read as well
(`StepBlock.method`, `StepBlock.rewards`), and what it reads handed on a chunk at a time (`read_into`), so a Monitor
takes in the first steps while the rest is read.

Every line is treated as MetricsReader treats it: the same line splitting, the same checks of a line read by
position (its keys those of its shape's first line json.loads reads, JSON's separators, numbers in its values; a
value this parser does not read exactly goes to numpy's cast), every other line to events.from_line, a line that
holds no event skipped and counted. tests/core/train/test_method_columns.py reads damaged files with both readers and
compares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hone.core import events
from hone.core.train import metrics_series as series
from hone.core.train.json_floats import WIDTH, json_floats, masked_to
from hone.core.train.metrics_series import MetricsReader, StepColumns

# StepMetrics fields of the training methods the Monitor charts (None in other runs' lines, which leave them out).
METHOD_FIELDS = (
    "reward_margin",
    "reward_accuracy",
    "chosen_logps",
    "rejected_logps",
    "reward_mean",
    "reward_std",
    "completion_length",
    "kl",
    "clip_fraction",
)
# The columns read by position: the engine's chart columns, then the methods' (each optional in a line's shape).
_SCALARS = series._SCALARS + tuple((name, False) for name in METHOD_FIELDS)
_WHOLE = np.array([whole for _, whole in _SCALARS])
_NULL = np.frombuffer(b"null", np.uint8)
# Values parsed per json_floats call: its ~60 numpy operations then work on arrays that stay in the CPU's caches
# (2-4k rows ran about twice as fast per value as 64k), while the per-call costs stay small.
PARSE_ROWS = 4096


@dataclass(frozen=True)
class StepBlock(StepColumns):
    """StepColumns with the training methods' values: method[name] (n,) float64 for each of METHOD_FIELDS, NaN
    where a line has none; rewards[name] (n,) float64, each GRPO reward's mean, NaN where a line does not name it."""

    method: dict[str, np.ndarray] = field(default_factory=dict)
    rewards: dict[str, np.ndarray] = field(default_factory=dict)


class _Rows(series._Rows):
    """The engine's per-line values of a chunk, and the methods' columns."""

    def __init__(self, n: int):
        super().__init__(n)
        self.method = {name: np.full(n, np.nan) for name in METHOD_FIELDS}
        self.rewards: dict[str, np.ndarray] = {}

    def put(self, i: int, event: events.StepMetrics) -> bool:
        if not super().put(i, event):
            return False
        for name in METHOD_FIELDS:
            value = getattr(event, name)
            self.method[name][i] = np.nan if value is None else value
        for name, value in event.rewards.items():
            self.rewards.setdefault(name, np.full(len(self.ok), np.nan))[i] = value
        return True


class MethodColumnsReader(MetricsReader):
    """MetricsReader (same contract: `read()`, `skipped`, `skipped_note()`) returning StepBlock for runs of steps;
    `read_into(take)` gives each chunk's items to `take` as they are read."""

    def __init__(self, run_dir):
        super().__init__(run_dir)
        self._take: Callable[[list], None] | None = None

    def read_into(self, take: Callable[[list], None]) -> None:
        """`read()`, handing the items of each chunk (~8 MB of the file) to `take` as soon as they are read."""
        self._take = take
        try:
            self.read()
        finally:
            self._take = None

    def _parse(self, buf: bytearray, size: int) -> list:
        """MetricsReader._parse with this module's reading by position and blocks."""
        a = np.frombuffer(buf, dtype=np.uint8)
        ends = np.flatnonzero(a[:size] == series._NEWLINE)
        starts = np.concatenate(([0], ends[:-1] + 1))
        rows = _Rows(len(ends))
        fast = _read_by_position(a, buf, starts, ends, rows)
        first_line = self.lines + 1
        self.lines += len(ends)
        drop_first, self._overlong = self._overlong, False
        if drop_first:  # the first line is the end of one longer than any event
            fast[0] = rows.ok[0] = False
            for lists in rows.lists.values():
                lists.pop(0, None)
            self._skip(first_line, f"a line longer than the {events.MAX_LINE_BYTES:,} bytes any event takes")
        items: dict[int, events.Event] = {}
        for i in np.flatnonzero(~fast).tolist():
            if i == 0 and drop_first:
                continue
            try:
                event = events.from_line(bytes(buf[starts[i] : ends[i]]))
            except events.EventError as e:
                self._skip(first_line + i, str(e))
                continue
            if not (isinstance(event, events.StepMetrics) and rows.put(i, event)):
                items[i] = event
        out = _in_order(items, rows, buf, starts, ends)
        if self._take is None:
            return out
        self._take(out)
        return []


def _read_by_position(a: np.ndarray, buf: bytearray, starts: np.ndarray, ends: np.ndarray, rows: _Rows) -> np.ndarray:
    """metrics_series._read_by_position, reading the groups with this module's `_read_group`."""
    fast = np.zeros(len(ends), dtype=bool)
    if len(ends) == 0:
        return fast
    prefix = np.frombuffer(series._PREFIX, np.uint8)
    step_like = np.all(sliding_window_view(a, len(prefix))[starts] == prefix, axis=1)
    if not step_like.any():
        return fast
    colons = np.flatnonzero(a[: ends[-1]] == series._COLON)
    before = np.searchsorted(colons, ends)
    counts = np.diff(before, prepend=0)
    shapes, sizes = np.unique(counts[step_like], return_counts=True)
    for count in shapes[np.argsort(-sizes)][: series._SHAPES].tolist():
        lines = np.flatnonzero(step_like & (counts == count))
        keys = next(
            (
                k
                for i in lines[: series._SAMPLES].tolist()
                if (k := series._keys_of(bytes(buf[starts[i] : ends[i]]))) is not None
            ),
            None,
        )
        if keys is None or len(keys) != count:
            continue
        base = before[lines] - count
        good = _read_group(a, buf, lambda k, base=base: colons[base + k], keys, lines, ends[lines], rows)
        fast[lines[good]] = True
    return fast


def _read_group(
    a: np.ndarray, buf: bytearray, colon: series._Colons, keys: list[str], lines: np.ndarray, ends: np.ndarray, rows
) -> np.ndarray:
    """metrics_series._read_group with the methods' columns: those of them the shape has are read like the chart
    columns (NaN where a value is no number), the others stay NaN."""
    read = [j for j, (name, _) in enumerate(_SCALARS) if name in keys]
    ks = [keys.index(_SCALARS[j][0]) for j in read]
    start = np.stack([colon(k) + 2 for k in ks], axis=1)
    end = np.stack([series._value_end(a, colon, k, keys, ends) for k in ks], axis=1)
    values, fine = _numbers(a, start, end, _WHOLE[read])
    # A line is read by position when the engine's columns are (as MetricsReader reads it); a method value that is
    # no number there reads as NaN, as a field the engine's reader does not read leaves the line to it.
    engine = np.array([_SCALARS[j][0] in rows.values for j in read])
    good = fine[:, engine].all(axis=1)
    values[~fine] = np.nan
    lists: dict[str, dict[int, list[int]]] = {}
    for name in series._LISTS:
        k = keys.index(name)
        lists[name] = {}
        good &= series._lists(a, buf, colon(k) + 2, series._value_end(a, colon, k, keys, ends), lists[name], lines)
    taken = lines[good]
    for column, j in enumerate(read):
        name = _SCALARS[j][0]
        target = rows.values[name] if name in rows.values else rows.method[name]
        target[taken] = values[good, column]
    for name, found in lists.items():
        rows.lists[name].update((i, v) for i, v in found.items() if good[np.searchsorted(lines, i)])
    rows.ok[taken] = True
    return good


def _numbers(a: np.ndarray, start: np.ndarray, end: np.ndarray, whole: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """metrics_series._numbers for (m, f) value spans, `whole` (f,) saying which columns are whole numbers: the
    floats by `json_floats`, any of them it does not read by numpy's cast (metrics_series._parsed), as before.
    Returns the values and, per value (m, f), whether it is one."""
    length = end - start
    ok = (length >= 1) & (length <= WIDTH)
    length = np.where(ok, length, 1)
    m, f = start.shape
    text = np.ascontiguousarray(sliding_window_view(a, WIDTH)[np.where(ok, start, 0)]).reshape(m * f, WIDTH)
    masked_to(text, length.ravel())
    text = text.reshape(m, f, WIDTH)
    nulls = (length == 4) & ~whole
    if nulls.any():
        nulls &= np.all(text[..., :4] == _NULL, axis=-1)
    unread = ~ok | nulls
    if unread.any():
        text[unread] = 0
        text[..., 0][unread] = ord("0")
        length = np.where(unread, 1, length)
    values = np.empty((m, f))
    floats, wholes = np.flatnonzero(~whole), np.flatnonzero(whole)
    if len(floats):
        values[:, floats] = _parsed(text[:, floats], length[:, floats])
    if len(wholes):  # numpy's cast of whole numbers is fast (~75 ns a value): kept, as MetricsReader parses them
        values[:, wholes] = series._parsed(np.ascontiguousarray(text[:, wholes]).view(f"S{WIDTH}")[..., 0], True)
    ok &= ~np.isnan(values) | nulls
    ok &= ~whole | (np.abs(values) < 2**53)
    values[nulls | ~np.isfinite(values)] = np.nan
    return values, ok


def _parsed(text: np.ndarray, length: np.ndarray) -> np.ndarray:
    """(m, c, WIDTH) texts of floats as (m, c) float64: by `json_floats`, PARSE_ROWS at a time, and what it does not
    read by metrics_series._parsed (numpy's cast, then float() one by one; NaN where it is no number), as before."""
    m, c = length.shape
    rows = np.ascontiguousarray(text).reshape(m * c, WIDTH)
    lengths = length.ravel()
    values, exact = np.empty(len(rows)), np.empty(len(rows), dtype=bool)
    for at in range(0, len(rows), PARSE_ROWS):
        part = slice(at, at + PARSE_ROWS)
        values[part], exact[part] = json_floats(rows[part], lengths[part])
    slow = np.flatnonzero(~exact)
    if len(slow):
        values[slow] = series._parsed(rows[slow].view(f"S{WIDTH}")[:, 0], False)
    return values.reshape(m, c)


def _in_order(items: dict[int, events.Event], rows: _Rows, buf: bytearray, starts: np.ndarray, ends: np.ndarray):
    """metrics_series._in_order, its runs of steps as StepBlock."""
    out: list = []
    bounds = [*sorted(items), len(rows.ok)]
    begin = 0
    for bound in bounds:
        lines = np.flatnonzero(rows.ok[begin:bound]) + begin
        if len(lines):
            block = series._block(rows, lines, buf, starts, ends)
            out.append(
                StepBlock(
                    **{f.name: getattr(block, f.name) for f in fields(StepColumns)},
                    method={name: rows.method[name][lines] for name in METHOD_FIELDS},
                    rewards={name: values[lines] for name, values in rows.rewards.items()},
                )
            )
        if bound in items:
            out.append(items[bound])
        begin = bound + 1
    return out

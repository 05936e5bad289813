"""The columns a run's charts draw, read fast from its metrics.jsonl, however long, and thinned for drawing.

A long run writes a StepMetrics line per step: a million steps are a 450 MB file, which `events.from_line` (json.loads
and a checked dataclass per line) reads in minutes. `MetricsReader` reads the file in large chunks with numpy
instead: a line that begins as a StepMetrics line and has the shape of the first one of its chunk (the same number of
`"key": value` pairs, so every key at the same place) gives the values the charts draw by position, each checked to
be a JSON number (or null, which reads as NaN); every other line, and any line whose values do not pass, goes to
`events.from_line`, so non-step events come back as events and a line that holds none is skipped and counted,
never raised. `downsample` thins a series to what a chart can show: every point up to `DRAWN_POINTS`, beyond that
the lowest and the highest point of each bucket (a spike stays visible) and the newest points exactly.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hone.core import events
from hone.core.train.run_dir import METRICS_FILE

# Bytes read at once: large enough that numpy's per-call costs vanish, small enough that a chunk and its scratch
# arrays stay in the CPU caches' reach and a reader's memory stays flat (~10 chunk sizes at the most). A reader on a
# Task's thread holds the interpreter for a chunk's longest numpy call: 8 MB chunks made a million-step replay stall
# the window ~140 ms at its start on a slow 2-core machine and take 4.3 s; 4 MB, ~115 ms and 3.6 s.
CHUNK_BYTES = 4 << 20
# The longest value read by position: a float's repr is at most 24 characters ("-1.2345678901234567e-308").
VALUE_BYTES = 24
# A chart draws at most this many points of a series: more than the pixels of a chart's width, so thinning changes
# nothing the eye can see, while pyqtgraph's redraw stays a few milliseconds.
DRAWN_POINTS = 4000
# Of them, the newest drawn exactly, point for point: where a live run's line ends is never a bucket's extreme.
EXACT_TAIL = 400
# The last steps of each block kept as whole events (the Monitor's numbers, its ETA over recent step times).
TAIL_EVENTS = 20

_PREFIX = b'{"event": "StepMetrics", '
_PAD = VALUE_BYTES + len(_PREFIX)
# Shapes of step line read by position in a chunk (a run resumed across versions of Hone has two), and the lines of
# a shape tried until one reads as JSON and gives the shape's keys.
_SHAPES = 4
_SAMPLES = 8
_NEWLINE, _COLON, _SPACE, _COMMA, _QUOTE = 10, 58, 32, 44, 34
# The StepMetrics fields the charts draw, read by position: (field, whole number).
_SCALARS = (
    ("step", True),
    ("time", False),
    ("loss", False),
    ("lr", False),
    ("tokens_per_s", False),
    ("mem_allocated", True),
    ("mem_reserved", True),
)
_LISTS = ("expert_load", "mem_by_gpu")
_WHOLE = np.array([whole for _, whole in _SCALARS])
# Where the k-th key's colon is, for each line of a group.
_Colons = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class StepColumns:
    """Consecutive StepMetrics lines of metrics.jsonl as columns, one entry per line in file order.

    step (n,) int64; time (n,) float64, seconds since the epoch; loss, lr, tokens_per_s (n,) float64, NaN where the
    run wrote null (not finite); mem_allocated, mem_reserved (n,) float64 bytes; mem_by_gpu (n, G) float64 bytes,
    NaN where a line lists fewer GPUs (G = 0 when no line lists any); expert_load (E,) float64: tokens per expert
    summed over the lines since the number of experts last changed, with experts_changed saying it changed within
    these lines (E = 0: no line lists experts); last: the last lines (up to TAIL_EVENTS) as whole events.
    """

    step: np.ndarray
    time: np.ndarray
    loss: np.ndarray
    lr: np.ndarray
    tokens_per_s: np.ndarray
    mem_allocated: np.ndarray
    mem_reserved: np.ndarray
    mem_by_gpu: np.ndarray
    expert_load: np.ndarray
    experts_changed: bool
    last: tuple[events.StepMetrics, ...]

    def __len__(self) -> int:
        return len(self.step)


class MetricsReader:
    """A run's metrics.jsonl read from where the last `read()` stopped (a run another process appends to), as
    StepColumns blocks and the other events, in file order.

    Like `EventTail` (whose counts it keeps): a line still being written waits for its end; a line that holds no
    event is skipped and counted in `skipped` (`skipped_note()` says so); a line longer than events.MAX_LINE_BYTES is
    dropped as it comes; a file rewritten shorter (a resume dropped the steps after its checkpoint) is read again
    from its start; a FIFO or device is not read.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / METRICS_FILE
        self.offset = 0
        self.partial = b""
        self.lines = 0
        self.skipped = 0
        self.first_skipped = ""
        self._overlong = False

    def read(self) -> list[events.Event | StepColumns]:
        """What the file gained since the last call: StepColumns for runs of step lines, events for the rest."""
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                return []
            with open(self.path, "rb") as f:
                if f.seek(0, os.SEEK_END) < self.offset:
                    self.__init__(self.path.parent)  # type: ignore[misc]
                f.seek(self.offset)
                return self._read_chunks(f)
        except OSError:
            return []  # not written yet, or gone

    def skipped_note(self) -> str:
        """ "12 lines of metrics.jsonl could not be read (line 5: why)"; "" when every line held an event."""
        if not self.skipped:
            return ""
        lines = "1 line" if self.skipped == 1 else f"{self.skipped:,} lines"
        return f"{lines} of {METRICS_FILE} could not be read ({self.first_skipped})"

    def _read_chunks(self, f) -> list[events.Event | StepColumns]:
        out: list[events.Event | StepColumns] = []
        buf = bytearray()
        while True:
            held = len(self.partial)
            if len(buf) < held + CHUNK_BYTES + _PAD:  # one buffer for the whole read: no 8 MB copies per chunk
                buf = bytearray(held + CHUNK_BYTES + _PAD)
            buf[:held] = self.partial
            got = f.readinto(memoryview(buf)[held : held + CHUNK_BYTES])
            if not got:
                return out
            self.offset += got
            end = held + got
            cut = buf.rfind(b"\n", 0, end) + 1
            self.partial = b""
            rest = bytes(buf[cut:end])
            if cut:
                buf[cut : cut + _PAD] = bytes(_PAD)  # a value read by position never reads past the last line
                out += self._parse(buf, cut)
            self._hold(rest)

    def _hold(self, rest: bytes) -> None:
        """Keep the start of a line still being written; drop a line longer than any event as it comes."""
        self.partial = b"" if self._overlong else self.partial + rest
        if len(self.partial) > events.MAX_LINE_BYTES:
            self._overlong, self.partial = True, b""

    def _skip(self, line_no: int, why: str) -> None:
        self.skipped += 1
        self.first_skipped = self.first_skipped or f"line {line_no}: {why}"

    def _parse(self, buf: bytearray, size: int) -> list[events.Event | StepColumns]:
        """The lines of buf[:size] (which ends with a newline) as blocks and events."""
        a = np.frombuffer(buf, dtype=np.uint8)
        ends = np.flatnonzero(a[:size] == _NEWLINE)
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
        return _in_order(items, rows, buf, starts, ends)


class _Rows:
    """Per line of a chunk, the values of a StepMetrics line (`ok`), filled by position or from an event."""

    def __init__(self, n: int):
        self.ok = np.zeros(n, dtype=bool)
        self.values = {name: np.full(n, np.nan) for name, _ in _SCALARS}
        self.lists: dict[str, dict[int, list[int]]] = {name: {} for name in _LISTS}
        self.events: dict[int, events.StepMetrics] = {}

    def put(self, i: int, event: events.StepMetrics) -> bool:
        """Take a step read by events.from_line; False when a value does not fit a column (a step past 2**53)."""
        values = {name: getattr(event, name) for name, _ in _SCALARS}
        if any(isinstance(v, int) and abs(v) >= 2**53 for v in values.values()):
            return False
        for name, value in values.items():
            self.values[name][i] = value
        for name in _LISTS:
            if getattr(event, name):
                self.lists[name][i] = getattr(event, name)
        self.events[i] = event
        self.ok[i] = True
        return True


def _read_by_position(a: np.ndarray, buf: bytearray, starts: np.ndarray, ends: np.ndarray, rows: _Rows) -> np.ndarray:
    """Read the StepMetrics lines of the chunk by position into `rows`; returns which lines were read so.

    Lines are read in groups of one shape (their number of keys): a version of Hone that adds a field writes lines
    of another shape, and a run resumed by it holds both. Each group's keys are those of its first line that
    json.loads reads; every line of the group is taken to have them in that order, and is read only where its
    separators are JSON's and its values JSON numbers.
    """
    fast = np.zeros(len(ends), dtype=bool)
    if len(ends) == 0:
        return fast
    step_like = np.all(sliding_window_view(a, len(_PREFIX))[starts] == np.frombuffer(_PREFIX, np.uint8), axis=1)
    if not step_like.any():
        return fast
    colons = np.flatnonzero(a[: ends[-1]] == _COLON)
    before = np.searchsorted(colons, ends)
    counts = np.diff(before, prepend=0)
    shapes, sizes = np.unique(counts[step_like], return_counts=True)
    for count in shapes[np.argsort(-sizes)][:_SHAPES].tolist():
        lines = np.flatnonzero(step_like & (counts == count))
        keys = next(
            (k for i in lines[:_SAMPLES].tolist() if (k := _keys_of(bytes(buf[starts[i] : ends[i]]))) is not None),
            None,
        )
        if keys is None or len(keys) != count:
            continue
        base = before[lines] - count
        good = _read_group(a, buf, lambda k, base=base: colons[base + k], keys, lines, ends[lines], rows)
        fast[lines[good]] = True
    return fast


def _read_group(
    a: np.ndarray, buf: bytearray, colon: _Colons, keys: list[str], lines: np.ndarray, ends: np.ndarray, rows: _Rows
) -> np.ndarray:
    """Read lines of one shape (`colon(k)`: where their k-th key's colon is) into `rows`; returns which were."""
    ks = [keys.index(name) for name, _ in _SCALARS]
    start = np.stack([colon(k) + 2 for k in ks], axis=1)
    end = np.stack([_value_end(a, colon, k, keys, ends) for k in ks], axis=1)
    values, good = _numbers(a, start, end)
    lists: dict[str, dict[int, list[int]]] = {}
    for name in _LISTS:
        k = keys.index(name)
        lists[name] = {}
        good &= _lists(a, buf, colon(k) + 2, _value_end(a, colon, k, keys, ends), lists[name], lines)
    taken = lines[good]
    for j, (name, _) in enumerate(_SCALARS):
        rows.values[name][taken] = values[good, j]
    for name, found in lists.items():
        rows.lists[name].update((i, v) for i, v in found.items() if good[np.searchsorted(lines, i)])
    rows.ok[taken] = True
    return good


def _keys_of(line: bytes) -> list[str] | None:
    """The keys of a StepMetrics line in order, when it holds every field the charts draw."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("event") != "StepMetrics":
        return None
    keys = list(data)
    wanted = [name for name, _ in _SCALARS] + list(_LISTS)
    return keys if all(name in keys for name in wanted) else None


def _value_end(a: np.ndarray, colon: _Colons, k: int, keys: list[str], line_ends: np.ndarray) -> np.ndarray:
    """Where the value after the k-th key ends (exclusive), or -1 where the line's separators are not JSON's: `, "`
    before the next key (of the length the shape says), `}` at the line's end."""
    if k + 1 < len(keys):
        end = colon(k + 1) - len(keys[k + 1]) - 4  # ', "key": ' before the next colon
        ok = (a[end] == _COMMA) & (a[end + 2] == _QUOTE)
    else:
        end = line_ends - 1
        ok = a[end] == ord("}")
    ok &= a[colon(k) + 1] == _SPACE
    return np.where(ok, end, -1)


def _numbers(a: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The numbers in a[start:end] as float64, for (m, len(_SCALARS)) start and end, and which lines hold all of
    theirs. A float may be null (it was not finite) or past float's range: NaN. A whole number is parsed as an
    integer (four times faster) and must stay below 2**53 (a float holds it exactly). numpy's parser is the check:
    a value that is no number fails it, and the lines are then parsed one by one."""
    length = end - start
    ok = (length >= 1) & (length <= VALUE_BYTES)
    text = sliding_window_view(a, VALUE_BYTES)[start]  # (m, fields, VALUE_BYTES), a copy
    text[np.arange(VALUE_BYTES) >= length[..., None]] = 0  # trailing NULs end a numpy bytes string
    nulls = (length == 4) & ~_WHOLE
    if nulls.any():
        nulls &= np.all(text[..., :4] == np.frombuffer(b"null", np.uint8), axis=-1)
    unread = ~ok | nulls
    if unread.any():
        text[unread] = 0
        text[..., 0][unread] = ord("0")
    strings = text.view(f"S{VALUE_BYTES}")[..., 0]  # (m, fields)
    values = np.empty(strings.shape)
    for columns, whole in ((np.flatnonzero(_WHOLE), True), (np.flatnonzero(~_WHOLE), False)):
        values[:, columns] = _parsed(strings[:, columns], whole)
    ok &= ~np.isnan(values) | nulls
    ok &= ~_WHOLE | (np.abs(values) < 2**53)
    values[nulls | ~np.isfinite(values)] = np.nan
    return values, ok.all(axis=1)


def _parsed(strings: np.ndarray, whole: bool) -> np.ndarray:
    """Bytes strings as float64 (whole numbers parsed as integers); NaN where one is no number."""
    try:
        return strings.astype(np.int64 if whole else np.float64).astype(np.float64, copy=False)
    except (ValueError, OverflowError):
        parse = _int_or_nan if whole else _float_or_nan
        return np.array([parse(s) for s in strings.ravel().tolist()], dtype=np.float64).reshape(strings.shape)


def _float_or_nan(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _int_or_nan(text: bytes) -> float:
    try:
        return float(int(text))
    except (ValueError, OverflowError):
        return math.nan


def _lists(
    a: np.ndarray, buf: bytearray, start: np.ndarray, end: np.ndarray, into: dict[int, list[int]], lines: np.ndarray
) -> np.ndarray:
    """Which lines hold a JSON list of whole numbers in buf[start:end]; the non-empty ones go to `into` by line."""
    ok = end >= start + 2
    empty = ok & (end == start + 2) & (a[start] == ord("[")) & (a[start + 1] == ord("]"))
    for j in np.flatnonzero(ok & ~empty).tolist():
        try:
            value = json.loads(bytes(buf[start[j] : end[j]]))
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            into[int(lines[j])] = value
        else:
            ok[j] = False
    return ok


def _in_order(
    items: dict[int, events.Event], rows: _Rows, buf: bytearray, starts: np.ndarray, ends: np.ndarray
) -> list[events.Event | StepColumns]:
    """The chunk's events and its runs of step lines (as StepColumns), in file order."""
    out: list[events.Event | StepColumns] = []
    bounds = [*sorted(items), len(rows.ok)]
    begin = 0
    for bound in bounds:
        lines = np.flatnonzero(rows.ok[begin:bound]) + begin
        if len(lines):
            out.append(_block(rows, lines, buf, starts, ends))
        if bound in items:
            out.append(items[bound])
        begin = bound + 1
    return out


def _block(rows: _Rows, lines: np.ndarray, buf: bytearray, starts: np.ndarray, ends: np.ndarray) -> StepColumns:
    values = {name: rows.values[name][lines] for name, _ in _SCALARS}
    gpus = _listed(rows.lists["mem_by_gpu"], lines)
    mem_by_gpu = np.full((len(lines), max((len(v) for _, v in gpus), default=0)), np.nan)
    for j, value in gpus:
        mem_by_gpu[j, : len(value)] = value
    expert_load, changed = _expert_sum([load for _, load in _listed(rows.lists["expert_load"], lines)])
    last = []
    for i in lines[-TAIL_EVENTS:].tolist():
        event = rows.events.get(i) or _event_or_none(bytes(buf[starts[i] : ends[i]]))
        if event is not None:
            last.append(event)
    return StepColumns(
        step=values.pop("step").astype(np.int64),
        **values,
        mem_by_gpu=mem_by_gpu,
        expert_load=expert_load,
        experts_changed=changed,
        last=tuple(last),
    )


def _listed(lists: dict[int, list[int]], lines: np.ndarray) -> list[tuple[int, list[int]]]:
    """(place in `lines`, list) of the lines of `lines` that list something, in order."""
    if not lists:
        return []
    found = np.flatnonzero(np.isin(lines, np.fromiter(lists, dtype=np.int64, count=len(lists))))
    return [(j, lists[int(lines[j])]) for j in found.tolist()]


def _expert_sum(listed: list[list[int]]) -> tuple[np.ndarray, bool]:
    """Tokens per expert summed over the lines since the number of experts last changed, and whether it changed."""
    if not listed:
        return np.zeros(0), False
    size = len(listed[-1])
    since = len(listed)
    while since > 0 and len(listed[since - 1]) == size:
        since -= 1
    return np.asarray(listed[since:], dtype=np.float64).sum(axis=0), since > 0


def _event_or_none(line: bytes) -> events.StepMetrics | None:
    try:
        event = events.from_line(line)
    except events.EventError:
        return None  # read by position, but a field the charts do not draw is of another type
    return event if isinstance(event, events.StepMetrics) else None


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = DRAWN_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` of the points (x, y), in order: all of them when they are that few; otherwise the newest
    EXACT_TAIL (scaled down for a small `max_points`) exactly, and before them equal buckets of consecutive points,
    each drawn as its lowest and its highest point (a NaN counts as neither), so a spike stays in the picture.

    Args:
        x, y: (n,) arrays of the same length.
        max_points: at least 4.
    """
    n = len(x)
    if n <= max_points:
        return x, y
    tail = min(EXACT_TAIL, max_points // 10)
    buckets = (max_points - tail) // 2 - 1  # one more for the points left over at the start
    size = -(-(n - tail) // buckets)
    head = n - tail - (n - tail) // size * size  # the points before the first whole bucket: a bucket of their own
    whole = y[head : n - tail].reshape(-1, size)
    picks = [_extremes(y[:head], 0)] if head else []
    picks += [_extremes(whole, head), np.arange(n - tail, n)]
    index = np.concatenate(picks)
    return x[index], y[index]


def _extremes(values: np.ndarray, offset: int) -> np.ndarray:
    """Indices (plus offset) of the lowest and the highest value of each row of `values` (one row when 1-D), each
    row's two in their order."""
    rows = values.reshape(-1, values.shape[-1])
    nan = np.isnan(rows)
    low = np.where(nan, np.inf, rows).argmin(axis=1)
    high = np.where(nan, -np.inf, rows).argmax(axis=1)
    base = offset + np.arange(len(rows)) * rows.shape[1]
    return (base[:, None] + np.sort(np.stack([low, high], axis=1), axis=1)).ravel()

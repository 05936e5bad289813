"""Events a run emits: frozen dataclasses, stdlib only, one JSON line each in the run's metrics.jsonl.

The trainer yields them; the CLI prints them; the GUI worker re-emits them over a Qt signal. Every event
round-trips through `to_dict` / `from_dict`, which is how the GUI's run history reads old runs: `from_line` reads one
line of metrics.jsonl back, every field checked against its declared type, and refuses (EventError) what no Hone
wrote.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """Base of all events; `time` is wall-clock seconds since the epoch."""

    time: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class RunStarted(Event):
    """The model and data are loaded and the first step is about to run."""

    run_dir: str
    model: str
    device: str
    dtype: str
    params_total: int
    params_trainable: int
    total_steps: int
    tokens_per_epoch: int
    resumed_from_step: int = 0
    is_moe: bool = False
    is_vision: bool = False
    # Chosen speed paths and why, e.g. {"attention": "varlen (CUDA, torch 2.11)"}.
    speed_paths: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    processes: int = 1  # processes training the run together (one per GPU under torchrun)


@dataclass(frozen=True)
class DatasetReport(Event):
    """What happened to every row the user gave: kept, skipped (by reason, with row numbers), truncated."""

    split: str
    files: list[str]
    rows_read: int
    rows_kept: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    skipped_examples: list[str] = field(default_factory=list)  # "file:row: field: why", first few
    truncated: int = 0
    image_rows: int = 0
    tokens: int = 0  # tokens per epoch (kept rows, after truncation)
    trained_tokens: int = 0  # tokens that carry loss
    length_min: int = 0
    length_median: int = 0
    length_p95: int = 0
    length_max: int = 0
    format: str = ""
    held_out: int = 0  # rows moved from this split to the eval split (data.eval_fraction)
    problems: list[str] = field(default_factory=list)  # whole sources that could not be read, and why
    notes: list[str] = field(default_factory=list)  # choices made that the user should know about


@dataclass(frozen=True)
class StepMetrics(Event):
    """One optimizer step. `tokens` counts real (non-padding) tokens; times are synchronized."""

    step: int
    total_steps: int
    epoch: float
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    trained_tokens: int
    tokens_per_s: float
    step_time: float
    elapsed: float
    packing_efficiency: float = 1.0
    mem_allocated: int = 0  # bytes, peak during the step
    mem_reserved: int = 0  # bytes
    offload_bytes: int = 0  # bytes moved to host for checkpoints during the step
    copy_stall_s: float = 0.0  # time compute waited for checkpoint reloads
    buffer_bytes: int = 0  # device memory held by offload reload buffers
    data_wait_s: float = 0.0  # time the step waited for its batches (collated in the background, or here)
    expert_load: list[int] = field(default_factory=list)  # tokens per expert (MoE), summed over layers
    mem_by_gpu: list[int] = field(default_factory=list)  # bytes, each process's peak, when several train the run
    # Preference runs (train.method dpo, simpo, orpo; kto: desirable answers as chosen, undesirable as rejected),
    # means over the step's pairs (KTO: answers); None for other methods.
    reward_margin: float | None = None  # chosen answer's implicit reward minus the rejected one's
    reward_accuracy: float | None = None  # share of pairs whose chosen answer has the higher reward (KTO: of answers
    # whose reward has their label's sign)
    chosen_logps: float | None = None  # summed log-probability of the chosen answers' tokens
    rejected_logps: float | None = None  # the same for the rejected answers
    nll: float | None = None  # ORPO: the chosen answers' negative log-likelihood per token
    log_odds_ratio: float | None = None  # ORPO: log odds of the chosen answer against the rejected one
    kl: float | None = None  # KTO: its estimate of KL(fine-tune ‖ base), the point rewards are measured from;
    # GRPO: the mean per-token KL of the sampled answers against the base model (the adapter off)
    # GRPO runs (train.method grpo): over the step's sampled answers; None for other methods.
    reward_mean: float | None = None  # the weighted reward's mean (answers a reward failed on left out)
    reward_std: float | None = None  # its standard deviation
    rewards: dict[str, float] = field(default_factory=dict)  # each reward's mean, by name
    completion_length: float | None = None  # tokens per sampled answer
    clip_fraction: float | None = None  # share of answer tokens whose probability ratio was clipped
    reward_problems: list[str] = field(default_factory=list)  # rewards that failed on a row, and why (the first few)
    # GRPO: the step's best- and worst-rewarded answers, each "reward R · PROMPT → ANSWER" (cut to SAMPLE_CHARS)
    samples: list[str] = field(default_factory=list)

    @property
    def waiting_for_data(self) -> float:
        """The share of the step spent waiting for its batches, when worth saying (the background collation, e.g.
        image decoding, fell behind the GPU); 0.0 below 5% (the hand-over itself) and at step 1, which always
        collates its own batches."""
        if self.step <= 1 or self.step_time <= 0 or self.data_wait_s < 0.05 * self.step_time:
            return 0.0
        return self.data_wait_s / self.step_time


@dataclass(frozen=True)
class EvalMetrics(Event):
    """Mean loss over the evaluation rows' trained tokens."""

    step: int
    loss: float
    tokens: int


@dataclass(frozen=True)
class CheckpointSaved(Event):
    step: int
    path: str


@dataclass(frozen=True)
class Notice(Event):
    """Something the user should know that is not an error: a speed path fell back, a choice was made."""

    topic: str
    message: str
    level: str = "info"  # info | warning
    # The step a change takes effect from (0: before the first step), for notices the charts mark, such as the
    # memory planner's re-plans; None for notices about the run as a whole.
    step: int | None = None


@dataclass(frozen=True)
class RunPaused(Event):
    step: int


@dataclass(frozen=True)
class RunResumed(Event):
    step: int


@dataclass(frozen=True)
class RunFinished(Event):
    """The run ended normally (`stopped` when the user asked it to stop early)."""

    step: int
    run_dir: str
    adapter_dir: str
    final_loss: float
    elapsed: float
    stopped: bool = False
    eval_loss: float | None = None


@dataclass(frozen=True)
class RunFailed(Event):
    """The run could not go on. `reason` says what happened, `advice` what to change."""

    reason: str
    advice: str = ""
    step: int = 0
    details: str = ""  # traceback for the log, never shown as the message
    code: str = ""  # the HoneError's code: a kind of failure a front end can offer to fix ("data-changed")
    # The machine cut the run off (a GPU that stopped working), not its settings: it goes on from its last complete
    # checkpoint with `hone train --resume`, and run.json says "interrupted" instead of "failed".
    interrupted: bool = False


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        RunStarted,
        DatasetReport,
        StepMetrics,
        EvalMetrics,
        CheckpointSaved,
        Notice,
        RunPaused,
        RunResumed,
        RunFinished,
        RunFailed,
    )
}


# StepMetrics fields only some training methods fill (preference, GRPO): left out of a line while they hold their
# default, so a supervised run's step lines stay as short as before (a million of them are read back by the Monitor;
# a missing field reads back as its default).
_METHOD_METRICS = (
    "reward_margin", "reward_accuracy", "chosen_logps", "rejected_logps", "nll", "log_odds_ratio", "kl",
    "reward_mean", "reward_std", "rewards", "completion_length", "clip_fraction", "reward_problems", "samples",
)  # fmt: skip


def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict with the event's type under "event"."""
    data = {"event": type(event).__name__, **dataclasses.asdict(event)}
    if isinstance(event, StepMetrics):
        for name in _METHOD_METRICS:
            if data[name] is None or data[name] == {} or data[name] == []:
                del data[name]
    return data


# ---- reading events back (metrics.jsonl) ----

# The longest line a run writes is a RunFailed with its traceback, tens of kB; a longer line is none of Hone's, and
# a reader drops it without holding it whole (hone.core.train.run_dir.EventTail).
MAX_LINE_BYTES = 4 << 20


class EventError(ValueError):
    """A line or dict that is no event Hone writes; the message says why, naming the event kind and field."""


def quoted(value: Any) -> str:
    """A value read from a JSON file as a message quotes it: a string in quotes, anything else as JSON writes it
    (null, true, NaN, [1, 2]), at most 60 characters."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def json_kind(value: Any) -> str:
    """What kind of JSON value `value` is: object, array, string, number, boolean or null."""
    if isinstance(value, bool):
        return "boolean"
    kinds = {dict: "object", list: "array", str: "string", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


class _Wrong(Exception):
    """A value of another type than its field's; `path` leads from the field to it ("[0]", "['key']")."""

    def __init__(self, value: Any, expected: str, path: str = ""):
        super().__init__(expected)
        self.value, self.expected, self.path = value, expected, path


def _as_float(value: Any) -> float:
    # null is how a number that was not finite is written (a loss that became NaN): it reads back as NaN, as does any
    # other non-finite value, so every float field holds a float.
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Wrong(value, "not a number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return math.nan
    return number if math.isfinite(number) else math.nan


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Wrong(value, "not a whole number")
    return value


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise _Wrong(value, "not text")
    return value


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Wrong(value, "not true or false")
    return value


def _any(value: Any) -> Any:
    return value


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _list_of(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(value: Any) -> list:
        if not isinstance(value, list):
            raise _Wrong(value, "not a list")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(check(item))
            except _Wrong as e:
                raise _Wrong(e.value, e.expected, f"[{i}]{e.path}") from None
        return out

    return checked


def _dict_of(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def checked(value: Any) -> dict:
        if not isinstance(value, dict):
            raise _Wrong(value, "not an object")
        out = {}
        for key, item in value.items():  # JSON's keys are strings
            try:
                out[key] = check(item)
            except _Wrong as e:
                raise _Wrong(e.value, e.expected, f"[{key!r}]{e.path}") from None
        return out

    return checked


_PLAIN = {float: _as_float, int: _as_int, str: _as_str, bool: _as_bool}


def _checker(hint: Any) -> Callable[[Any], Any]:
    """The check of a value against a field's declared type: the plain types, `X | None`, `list[X]`,
    `dict[str, X]` and Any, as the events declare them."""
    if hint in _PLAIN:
        return _PLAIN[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(_checker(inner))
    if origin is list:
        return _list_of(_checker(args[0]))
    if origin is dict:
        return _dict_of(_checker(args[1]))
    if hint is Any:
        return _any
    raise TypeError(f"no check for a field declared {hint!r}")  # a new event field of a new kind: add its check


_FIELDS: dict[str, tuple[tuple[str, Callable[[Any], Any], bool], ...]] = {}  # by class name: built once per class


def _fields(cls: type[Event]) -> tuple[tuple[str, Callable[[Any], Any], bool], ...]:
    """(name, check, required) for each field of an event class."""
    if cls.__name__ in _FIELDS:
        return _FIELDS[cls.__name__]
    hints = typing.get_type_hints(cls)
    _FIELDS[cls.__name__] = fields = tuple(
        (
            f.name,
            _checker(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )
    return fields


def from_dict(data: Any) -> Event:
    """Rebuild an event written by `to_dict`, every field checked against the type its class declares, so no event
    with a field of another type leaves here. Keys no field has (from newer versions) are ignored; an int stands for
    a float; a float field written as null (it was not finite), or not finite, reads back as NaN; `time` must be a
    finite number (it is shown as a clock time).

    Raises:
        EventError: `data` is not a dict, its "event" names no event kind, a field is missing or of another type;
            the message names the kind and the field ("StepMetrics: loss is 'x', not a number").
    """
    if not isinstance(data, dict):
        raise EventError(f"a JSON {json_kind(data)}, not an object")
    if "event" not in data:
        raise EventError('a JSON object without an "event" key')
    kind = data["event"]
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventError(f"an event of unknown kind {quoted(kind)}")
    values = {}
    for name, check, required in _fields(cls):
        if name not in data:
            if required:
                raise EventError(f"{kind}: {name} is missing")
            continue
        try:
            values[name] = check(data[name])
        except _Wrong as e:
            raise EventError(f"{kind}: {name}{e.path} is {quoted(e.value)}, {e.expected}") from None
    if "time" in values and not math.isfinite(values["time"]):
        raise EventError(f"{kind}: time is {quoted(data['time'])}, not a time")
    return cls(**values)


def from_line(line: bytes | str) -> Event:
    """One line of metrics.jsonl (without its newline) as the event it holds: the per-line reader every reader of
    metrics.jsonl uses.

    Raises:
        EventError: the line is longer than MAX_LINE_BYTES, not UTF-8, not JSON, or not an event (`from_dict`).
    """
    if len(line) > MAX_LINE_BYTES:
        raise EventError(f"a line of {len(line):,} bytes, longer than the {MAX_LINE_BYTES:,} any event takes")
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EventError(f"not UTF-8 text (byte 0x{line[e.start]:02x} at offset {e.start})") from None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise EventError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer of more digits than Python reads
        raise EventError(f"not valid JSON ({e})") from None
    except RecursionError:
        raise EventError("JSON nested too deeply to read") from None
    return from_dict(data)

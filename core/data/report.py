"""The validation report: what happened to every row, as a DatasetReport event and as a terminal table.

Accounting rule (checked by the tests): rows_read == rows_kept + held_out + sum(skipped.values()).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from hone.core.data.rows import UNKNOWN_FORMAT, RowProblem
from hone.core.events import DatasetReport

# How many skipped rows a run's report lists by name (all are counted; `hone data check` lists every one); enough to
# spot a pattern.
MAX_EXAMPLES = 20
# How many rows a note on kept rows names (all are counted).
MAX_NOTED = 10


class ReportBuilder:
    """Counts rows as they pass through loading and tokenizing."""

    def __init__(self, split: str, files: list[str], max_examples: int | None = MAX_EXAMPLES):
        """`max_examples`: skipped rows listed by name; None = every one."""
        self.split, self.files, self.max_examples = split, files, max_examples
        self.rows_read = 0
        self.skipped: Counter[str] = Counter()
        self.examples: list[str] = []
        # A file whose columns match no format fails every row the same way: the first such row is listed once,
        # with how many more rows it stands for.
        self.unknown_format: dict[str, int] = {}  # detail -> index into examples
        self.repeats: dict[int, int] = {}  # index into examples -> further rows with the same problem
        self.kept_notes: dict[str, list] = {}  # note -> [count, first sources]
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.truncated = 0
        self.formats: Counter[str] = Counter()
        self.detections: dict[str, list[str]] = {}  # detected format -> sources

    def read(self, count: int = 1) -> None:
        self.rows_read += count

    def skip(self, problem: RowProblem) -> None:
        self.skipped[problem.reason] += 1
        if problem.reason == UNKNOWN_FORMAT and problem.detail in self.unknown_format:
            index = self.unknown_format[problem.detail]
            self.repeats[index] = self.repeats.get(index, 0) + 1
            return
        if self.max_examples is None or len(self.examples) < self.max_examples:
            if problem.reason == UNKNOWN_FORMAT:
                self.unknown_format[problem.detail] = len(self.examples)
            self.examples.append(problem.message)

    def kept_with_note(self, source: str, note: str) -> None:
        """A kept row that was changed or is unusual (a hone.core.data.turn_order note)."""
        entry = self.kept_notes.setdefault(note, [0, []])
        entry[0] += 1
        if len(entry[1]) < MAX_NOTED:
            entry[1].append(source)

    def problem(self, message: str) -> None:
        """A whole source that could not be read."""
        self.problems.append(message)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def detected(self, source: str, fmt: str) -> None:
        """The format auto-detection chose for a source."""
        self.detections.setdefault(fmt, []).append(source)

    def to_state(self) -> dict:
        return {
            "rows_read": self.rows_read,
            "skipped": dict(self.skipped),
            "examples": self.examples,
            "problems": self.problems,
            "notes": self.notes,
            "truncated": self.truncated,
            "formats": dict(self.formats),
            "detections": self.detections,
            "repeats": {str(k): v for k, v in self.repeats.items()},
            "kept_notes": self.kept_notes,
        }

    @classmethod
    def from_state(cls, split: str, files: list[str], state: dict) -> ReportBuilder:
        builder = cls(split, files)
        builder.rows_read = state["rows_read"]
        builder.skipped.update(state["skipped"])
        builder.examples = list(state["examples"])
        builder.problems = list(state["problems"])
        builder.notes = list(state["notes"])
        builder.truncated = state["truncated"]
        builder.formats.update(state["formats"])
        builder.detections = {k: list(v) for k, v in state["detections"].items()}
        builder.repeats = {int(k): v for k, v in state.get("repeats", {}).items()}
        builder.kept_notes = {k: [v[0], list(v[1])] for k, v in state.get("kept_notes", {}).items()}
        return builder

    def build(
        self,
        lengths: np.ndarray,
        trained_lengths: np.ndarray,
        image_rows: int,
        held_out: int = 0,
        truncated: int | None = None,
        rows_kept: int | None = None,
    ) -> DatasetReport:
        """The event for the rows kept in this split.

        Args:
            lengths: int64 [kept rows], tokens per kept row (empty when nothing was tokenized).
            trained_lengths: int64 [kept rows], trained tokens per kept row.
            image_rows: kept rows that have images.
            held_out: rows moved to the eval split.
            truncated: truncated rows among the kept ones (default: all truncations counted here).
            rows_kept: kept rows when nothing was tokenized (default: len(lengths)).
        """
        stats = length_stats(lengths)
        return DatasetReport(
            split=self.split,
            files=list(self.files),
            rows_read=self.rows_read,
            rows_kept=len(lengths) if rows_kept is None else rows_kept,
            skipped=dict(self.skipped.most_common()),
            skipped_examples=self._examples(),
            truncated=self.truncated if truncated is None else truncated,
            image_rows=image_rows,
            tokens=int(np.sum(lengths)),
            trained_tokens=int(np.sum(trained_lengths)),
            **stats,
            format=", ".join(
                f"{name} ({count})" if len(self.formats) > 1 else name for name, count in self.formats.most_common()
            ),
            held_out=held_out,
            problems=list(self.problems),
            notes=self._detection_notes() + self._kept_notes() + list(self.notes),
        )

    def _examples(self) -> list[str]:
        return [
            f"{m} (and {self.repeats[i]:,} more rows like it)" if self.repeats.get(i) else m
            for i, m in enumerate(self.examples)
        ]

    def _kept_notes(self) -> list[str]:
        notes = []
        for note, (count, sources) in self.kept_notes.items():
            more = f" and {count - len(sources):,} more" if count > len(sources) else ""
            notes.append(f"{count:,} row{'s' if count != 1 else ''} {note} (kept): {', '.join(sources)}{more}")
        return notes

    def _detection_notes(self) -> list[str]:
        notes = []
        for fmt, sources in self.detections.items():
            names = ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
            notes.append(f"format detected as {fmt}: {names} (set data.format to override)")
        return notes


def length_stats(lengths: np.ndarray) -> dict[str, int]:
    """min / median / p95 / max of row lengths. Percentiles are actual row lengths (the smallest length that at
    least that share of rows does not exceed), so they read as "95% of rows have at most N tokens"."""
    if len(lengths) == 0:
        return {"length_min": 0, "length_median": 0, "length_p95": 0, "length_max": 0}
    lengths = np.asarray(lengths)
    return {
        "length_min": int(lengths.min()),
        "length_median": int(np.percentile(lengths, 50, method="inverted_cdf")),
        "length_p95": int(np.percentile(lengths, 95, method="inverted_cdf")),
        "length_max": int(lengths.max()),
    }


def format_report(report: DatasetReport, color: bool = False) -> str:
    """The report as a plain-text table for the terminal."""
    bold = (lambda s: f"\033[1m{s}\033[0m") if color else (lambda s: s)
    warn = (lambda s: f"\033[33m{s}\033[0m") if color else (lambda s: s)
    lines = [bold(f"{report.split} data: {', '.join(report.files) or '(none)'}")]
    rows = [
        ("format", report.format or "-"),
        ("rows read", f"{report.rows_read:,}"),
        ("rows kept", f"{report.rows_kept:,}"),
    ]
    if report.held_out:
        rows.append(("held out for eval", f"{report.held_out:,}"))
    rows.append(("rows skipped", f"{sum(report.skipped.values()):,}"))
    rows += [(f"  {reason}", f"{count:,}") for reason, count in report.skipped.items()]
    if report.tokens:
        rows += [
            ("truncated", f"{report.truncated:,}"),
            ("image rows", f"{report.image_rows:,}"),
            ("tokens per epoch", f"{report.tokens:,}"),
            ("trained tokens", f"{report.trained_tokens:,}"),
            (
                "length min / median / p95 / max",
                f"{report.length_min:,} / {report.length_median:,} / {report.length_p95:,} / {report.length_max:,}",
            ),
        ]
    elif report.image_rows:
        rows.append(("image rows", f"{report.image_rows:,}"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if report.skipped_examples:
        shown = len(report.skipped_examples)
        total = sum(report.skipped.values())
        lines.append(bold(f"  skipped rows{f' (first {shown} of {total:,})' if total > shown else ''}:"))
        lines += [warn(f"    {m}") for m in report.skipped_examples]
    if report.problems:
        lines.append(bold("  sources not read:"))
        lines += [warn(f"    {m}") for m in report.problems]
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines)

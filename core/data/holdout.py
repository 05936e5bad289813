"""Evaluation rows held out of the training data (data.eval_fraction): one rule for supervised rows
(hone.core.data.pipeline), preference pairs (hone.core.data.preference) and KTO's labelled answers
(hone.core.data.unpaired), so that the same data, fraction and seed hold out the same rows whatever the method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hone.core.data.report import ReportBuilder

# Mixed into the run seed so that the held-out rows do not follow the other draws made from the seed alone.
_SEED_SALT = 0x5EED


def hold_out(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(held-out indices, kept indices) of `count` rows (count >= 2), both sorted int64: round(count * fraction)
    rows, at least one and at most count - 1, the first of a permutation seeded with (seed, _SEED_SALT)."""
    n_eval = min(count - 1, max(1, round(count * fraction)))
    mask = np.zeros(count, dtype=bool)
    mask[np.random.default_rng([seed, _SEED_SALT]).permutation(count)[:n_eval]] = True
    return np.flatnonzero(mask), np.flatnonzero(~mask)


@dataclass
class HeldOut:
    """Where a split's rows went: `eval_rows` and `train_rows` (sorted indices into the split) and the evaluation
    split's report, which counts the held-out rows as read and names the rule."""

    eval_rows: np.ndarray
    train_rows: np.ndarray
    report: ReportBuilder


def hold_out_rows(count: int, fraction: float, seed: int, train_report: ReportBuilder, unit: str = "rows") -> HeldOut:
    """`hold_out` of a training split of `count` rows whose report is `train_report`, with the evaluation split's
    report: the training files, the held-out count read, the training formats, and a note saying how many `unit`
    ("rows", "pairs") were held out and by which setting and seed."""
    eval_rows, train_rows = hold_out(count, fraction, seed)
    report = ReportBuilder("eval", list(train_report.files))
    report.read(len(eval_rows))
    report.formats.update(train_report.formats)
    report.note(
        f"{len(eval_rows):,} {unit} held out from the training data (data.eval_fraction = {fraction}, seed {seed})"
    )
    return HeldOut(eval_rows, train_rows, report)

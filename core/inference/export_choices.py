"""Which weights of a run can be exported, as the Studio offers them: the final adapter, the best checkpoint by each
metric the stored scores hold, and every saved checkpoint with its held-out loss where it was scored.

Reads RUN_DIR/scores.json and the checkpoints' manifests only (no weights, no torch): what `hone eval RUN
--checkpoints all` (or train.eval_checkpoints) stored is what "best" means, on the data scored most recently, as
`hone export RUN --checkpoint best --by METRIC` picks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hone.core.inference.score_store import (
    METRICS,
    best_entry,
    checkpoint_weights,
    current_entries,
    latest_data,
    read_scores,
)

# The metrics a user picks the best checkpoint by, in words (perplexity picks what the loss picks).
BEST_BY = {
    "loss": "held-out loss",
    "exact": "exact match",
    "normalized": "normalized match",
    "f1": "word F1",
    "contains": "answers containing the reference",
    "json_valid": "valid JSON",
}


@dataclass(frozen=True)
class WeightsChoice:
    """One entry of the Export page's weights list.

    Attributes:
        label: what the list shows.
        checkpoint: the checkpoint's step, None for the final adapter.
        scores: that checkpoint's stored score entry as a dict (for the model card), None when unscored.
        by: the metric it is the best by, None for the final adapter and plain steps.
    """

    label: str
    checkpoint: int | None = None
    scores: dict | None = None
    by: str | None = None


def _value(metric: str, value: float) -> str:
    return f"{value:.4g}" if METRICS[metric][1] else f"{100 * value:.0f}%"


def weights_choices(run_dir: str | Path) -> tuple[list[WeightsChoice], str]:
    """(the choices, a line saying what the scores are and where they come from, "" when there are none)."""
    run_dir = Path(run_dir)
    choices = [WeightsChoice("Final adapter")]
    weights = checkpoint_weights(run_dir)
    stored = read_scores(run_dir)
    entries = current_entries(stored, weights)
    data = latest_data(entries)
    on_data = [e for e in entries if e.data == data]
    for metric, words in BEST_BY.items():
        best = best_entry(on_data, metric) if data is not None else None
        if best is not None:
            value = _value(metric, best.metrics[metric])
            label = f"Best by {words}: step {best.checkpoint} ({value})"
            choices.append(WeightsChoice(label, best.checkpoint, best.as_dict(), metric))
    scored = {e.checkpoint: e for e in on_data}
    for step in weights:
        entry = scored.get(step)
        loss = entry.metrics.get("loss") if entry is not None else None
        label = f"Step {step}" + (f" (held-out loss {loss:.4g})" if loss is not None else "")
        choices.append(WeightsChoice(label, step, entry.as_dict() if entry is not None else None))
    if data is not None:
        note = f"Scores on {data.rows} held-out rows of {Path(data.path).name}."
    elif weights:
        note = "The checkpoints are not scored yet: hone eval RUN --checkpoints all scores them."
    else:
        note = ""
    if stored.damage:
        note = (note + f" The stored scores are damaged ({stored.damage}).").strip()
    return choices, note

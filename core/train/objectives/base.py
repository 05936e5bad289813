"""The interface between the training loop and a training method (SFT today; preference and RL methods next)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from hone.core.config import RunConfig
    from hone.core.data.pipeline import TrainingData


class Objective(Protocol):
    """One training method, as the trainer sees it.

    A step sums `loss_sum` over its micro-batches and divides by the units of all its rows (counted on the host,
    so normalizing costs no device sync); backward, clipping and the optimizer are the loop's. Evaluation reports the
    same ratio over the evaluation rows.
    """

    name: ClassVar[str]  # the method's name, as a run's config names it

    def load_data(self, config: RunConfig, tokenizer) -> TrainingData:
        """The run's training (and evaluation) rows in the form this method trains on, with the data reports."""
        ...

    def loss_sum(self, model, batch, *, evaluating: bool = False) -> torch.Tensor:
        """The loss of one micro-batch on the model's device, summed over its units: an fp32 scalar."""
        ...

    def units(self, batch) -> int:
        """What `loss_sum` of a collated micro-batch is a sum over, counted on the host (SFT: trained tokens)."""
        ...

    def row_units(self, dataset, rows: list[int]) -> int:
        """The same count for rows of the tokenized data, before collation: a step shared among processes is
        normalized by the units of all its rows, which no single process's batches know."""
        ...

    def step_metrics(self) -> dict:
        """Fields of this method's own for the step's StepMetrics, read once per step after its micro-batches."""
        ...

    def forget_step(self) -> None:
        """Drop what this step's micro-batches recorded for `step_metrics` so far: the step runs again on smaller
        micro-batches (out of memory), or the micro-batch was a trial that trained nothing (the preflight)."""
        ...

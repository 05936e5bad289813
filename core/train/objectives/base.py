"""The interface between the training loop and a training method (SFT, preference and RL methods), and what a method's
own preparation step reads (`ObjectiveSetup`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from hone.core.config import RunConfig
    from hone.core.data.pipeline import TrainingData


class Objective(Protocol):
    """One training method, as the trainer sees it.

    A step sums `loss_sum` over its micro-batches and divides by the units of all its rows (counted on the host,
    so normalizing costs no device sync); backward, clipping and the optimizer are the loop's. Evaluation reports the
    same ratio over the evaluation rows.

    Optional hooks, looked up with getattr where a method has them: `prepare(setup)` runs once before step 1 and
    yields Notices (DPO and KTO compute their reference log-probabilities there); `annotate(batch, dataset, rows)`
    gives a collated micro-batch what the method keeps per row of the data; `collate(rows)` replaces the collation
    (GRPO's prompts); `choose_sampler`, `checkpoint_state` and `load_checkpoint_state` (GRPO, KTO).
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


@dataclass(frozen=True)
class ObjectiveSetup:
    """The run as `Trainer._prepare` settled it, for an objective's `prepare` step (just before step 1).

    Attributes:
        config: the config the run trains with.
        model: the model with its speed paths and LoRA (a peft model).
        data: the run's training and evaluation rows (`load_data`'s result).
        steps: the run's StepRunner (hone.core.train.step): `collate`, `autocast()`, `device`, `reset_meters()`.
        stream: the run's PackStream: which rows each pack holds, epoch by epoch.
        positions: the stream positions of the packs the run's remaining steps take (a resume's start on).
        world: this process's place among the run's processes (hone.core.train.distributed.World).
        stop_requested: true once the user asked the run to stop (checked between micro-batches).
        dtype: the weights' torch dtype.
    """

    config: RunConfig
    model: Any
    data: TrainingData
    steps: Any
    stream: Any
    positions: range
    world: Any
    stop_requested: Callable[[], bool]
    dtype: Any

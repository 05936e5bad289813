"""The training run in three parts: prepare -> loop -> finish, events out.

`Trainer(config).run()` is a generator of events (hone.core.events); every event is also appended to the run
folder's metrics.jsonl. Failures become a RunFailed event with advice, never an exception out of run().

`_prepare` (prepare.py) settles the run once: the config as it will train (the step shared among processes, the
memory fit, a resume's pack order, packing where the model allows it), the model with its speed paths and LoRA, the
data, the optimizer and where a resume starts. Everything the loop reads is on the `PreparedRun` it returns. `_loop`
is the step itself; the run's objective (hone.core.train.objectives) says what a micro-batch's loss is, so the loop
is the same for every training method. `_finish` evaluates, saves and reports.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.data import packing_efficiency
from hone.core.errors import HoneError
from hone.core.models.load import pick_device
from hone.core.train import checkpoints as ckpt
from hone.core.train import distributed
from hone.core.train.adapter_dir import save_adapter
from hone.core.train.interruptions import CheckpointClock, is_gpu_failure, unexpected_failure
from hone.core.train.objectives import Objective
from hone.core.train.prepare import Events, PreparedRun, RunPreparation
from hone.core.train.reporting import close_reporters
from hone.core.train.run_dir import ADAPTER_DIR, RunWriter
from hone.core.train.run_facts import RunFacts
from hone.core.train.sample_answers import SampleAnswers
from hone.core.train.step import StepRunner, split_packs

OOM_ADVICE = (
    "lower train.batch_tokens, set speed.checkpoint = offload, or turn on lora.qlora (`hone plan RUN.toml` "
    "says what fits)"
)


class Trainer(RunPreparation):
    """Runs one fine-tuning run. `resume_dir` continues a run from its newest complete checkpoint; `data_changed`
    (refuse | restart-epoch | continue) says what to do when its training files changed since (resume_checks).
    What runs before step 1 is `RunPreparation`'s (prepare.py); the loop and the finish are here."""

    def __init__(
        self,
        config: RunConfig,
        control: RunControl | None = None,
        *,
        resume_dir: str | Path | None = None,
        device: str | None = None,
        data_changed: str = "refuse",
        world: distributed.World | None = None,
        objective: Objective | None = None,
    ):
        self.config = config
        # the processes training this run together (torchrun); one plain process otherwise
        self.world = world if world is not None else distributed.from_environment()
        self.data_changed = data_changed
        self.facts: RunFacts | None = None  # what each checkpoint records about the run (config, data hashes)
        self.control = control or RunControl()
        self.resume_dir = Path(resume_dir) if resume_dir else None
        self.device = device or pick_device()
        self.step = 0
        self.split = 1  # micro-batches each pack runs as: set by the preflight, doubled by an out-of-memory step
        self.memory = None  # the memory the run may use (hone.core.memory.run_plan.Memory), read on a GPU
        self.predicted: float | None = None  # the planner's peak of a step, bytes
        self.fits_whole: bool | None = None  # whether the planner found a step fits with the whole model
        self.sharded = False  # train.parallel chose fsdp (hone.core.train.sharding)
        self.memory_meter = None  # measures the preflight (preflight.CudaMeter on a GPU)
        self.reporters: list = []  # output.report_to, opened once the run knows the step it starts from
        self.writer: RunWriter | None = None
        self.step_loop: StepRunner | None = None
        self.model = None  # the peft model once loaded (tests and the demo read it after the run)
        self.samples: SampleAnswers | None = None  # train.sample_prompts' answers at each evaluation
        self.tokenizer = None
        # what the run minimizes (hone.core.train.objectives); set up for the config the run settles on
        self.objective = objective
        # Held while a checkpoint or the adapter is written: a stop that cannot wait for a step waits for this
        # (hone.core.cli.stop_signals), so no save is cut in half. `clock` times checkpoints by time (monotonic).
        self.saving = threading.RLock()
        self.clock = time.monotonic

    # ---- events ----
    def _emit(self, event: events.Event) -> events.Event:
        if self.writer is not None:
            self.writer.write(event)  # metrics.jsonl, and train.log in words
        for reporter in self.reporters:  # output.report_to: TensorBoard, W&B
            reporter.report(event)
        return event

    def run(self) -> Iterator[events.Event]:
        """Run the whole fine-tuning run, yielding its events; nothing escapes (failures become RunFailed).

        For each optimizer step: micro-batches (packed rows) -> forward -> the objective's summed loss -> backward
        (scaled by 1 / the units of the whole step, e.g. trained tokens, so the loss is weighted alike across
        micro-batches) -> clip -> optimizer -> scheduler -> StepMetrics event.
        """
        try:
            yield from self._run()
        except HoneError as e:
            yield self._emit(events.RunFailed(reason=e.message, advice=e.advice, step=self.step, code=e.code))
        except torch.OutOfMemoryError:
            used = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
            yield self._emit(
                events.RunFailed(
                    reason=f"the GPU ran out of memory at step {self.step} ({used:.1f} GiB in use)",
                    advice=OOM_ADVICE,
                    step=self.step,
                    details=traceback.format_exc(),
                )
            )
        except Exception as e:  # anything else: keep the traceback in the log, tell the user where it is
            yield self._emit(self._unexpected_failure(e, traceback.format_exc()))
        finally:
            if self.step_loop is not None:
                self.step_loop.close()
            if self.samples is not None:
                self.samples.close()
            close_reporters(self.reporters)
            self.reporters = []
            if self.writer is not None:
                self.writer.close()
            if self.world.launched:
                distributed.leave()

    def _unexpected_failure(self, e: Exception, details: str) -> events.RunFailed:
        if is_gpu_failure(e) and self.step_loop is not None:  # its close would touch the failed GPU again
            self.step_loop, step_loop = None, self.step_loop
            with contextlib.suppress(Exception):
                step_loop.close()
        return unexpected_failure(e, self.step, self.writer.run_dir if self.writer is not None else None, details)

    # ---- the run ----
    def _run(self) -> Iterator[events.Event]:
        run = yield from self._prepare()
        stopped = yield from self._loop(run)
        yield from self._finish(run, stopped)

    # ---- loop: one optimizer step at a time ----
    def _loop(self, run: PreparedRun) -> Events:
        """Steps until the run's total or a stop; returns whether it was stopped."""
        run.last_loss = self.writer.last_loss if self.writer is not None else math.nan
        run.started = time.time()
        run.saves = CheckpointClock(run.config.output.checkpoint_minutes, self.clock)
        self.samples = SampleAnswers.for_run(
            run.config,
            run.tokenizer,
            run.data.eval,
            run.run_dir,
            self.step,
            self.world.main,
            run.step_loop.autocast_dtype,
        )
        while self.step < run.total:
            yield from self._wait_while_paused(run)
            if distributed.any_process(self.control.stop_requested, self.world):  # every process stops at one step
                return True
            packs = [run.stream.take(run.position + i) for i in range(run.config.train.grad_accum)]
            run.position += len(packs)
            metrics = yield from self._step(run, packs)
            self.step += 1
            for notice in run.setup.notices[run.notices_seen :]:  # speed paths may fall back mid-run
                yield self._emit(notice)
            run.notices_seen = len(run.setup.notices)
            yield from self._after_step(run, packs, metrics)
        return False

    def _wait_while_paused(self, run: PreparedRun) -> Events:
        if self.control.paused:
            yield self._emit(events.RunPaused(step=self.step))
            paused = self.clock()
            self.control.wait_while_paused()
            run.saves.paused_for(self.clock() - paused)  # checkpoints by time count training, not pauses
            if not self.control.stop_requested:
                yield self._emit(events.RunResumed(step=self.step))

    def _step(self, run: PreparedRun, packs: list[list[int]]) -> Events:
        """One optimizer step over `packs`; a step that runs out of memory runs again on smaller micro-batches of
        the same rows. Returns its metrics."""
        world, lengths, take = self.world, run.data.train.lengths, run.config.train.grad_accum
        upcoming = [run.stream.take(run.position + i) for i in range(take)] if self.step + 1 < run.total else None
        mine = world.share(packs)
        rows = [i for p in packs for i in p]
        counts = (int(sum(lengths[i] for i in rows)), self.objective.row_units(run.data.train, rows))
        while True:
            try:
                ahead = upcoming and split_packs(world.share(upcoming), lengths, self.split)
                return run.step_loop.step(
                    run.data.train,
                    split_packs(mine, lengths, self.split),
                    self.step,
                    run.total,
                    next_packs=ahead,
                    counts=counts,
                )
            except torch.OutOfMemoryError:
                run.step_loop.forget_step()
                yield from self._smaller_micro_batches(run, mine, len(packs))

    def _smaller_micro_batches(self, run: PreparedRun, mine: list[list[int]], taken: int) -> Events:
        """After an out-of-memory step: twice as many micro-batches from now on, or, at one row per micro-batch,
        the run saved up to the step before and ended."""
        if max(len(p) for p in split_packs(mine, run.data.train.lengths, self.split)) == 1:
            if not self.world.launched:  # (a save needs every process, and the others are mid-step)
                yield self._emit(self._checkpoint(run, run.position - taken))
            raise HoneError(
                f"the GPU ran out of memory at step {self.step + 1} even with one row per "
                "micro-batch; the run is saved up to the step before",
                OOM_ADVICE,
            ) from None
        self.split *= 2
        yield self._emit(
            events.Notice(
                topic="memory",
                level="warning",
                step=self.step + 1,
                message=(
                    f"out of GPU memory at step {self.step + 1}: running each micro-batch as {self.split} smaller ones "
                    "from now on (the same rows per step, so the loss curve stays comparable)"
                ),
            )
        )

    def _after_step(self, run: PreparedRun, packs: list[list[int]], metrics: dict) -> Events:
        """The step's event, then evaluation and a checkpoint when they are due."""
        config, data = run.config, run.data
        run.last_loss = metrics["loss"]
        efficiency = (
            packing_efficiency(packs, data.train.lengths, config.train.batch_tokens) if config.speed.packing else 1.0
        )
        yield self._emit(
            events.StepMetrics(
                step=self.step,
                total_steps=run.total,
                epoch=run.stream.epoch_progress(run.position),
                elapsed=time.time() - run.started,
                packing_efficiency=efficiency,
                **metrics,
            )
        )
        if not math.isfinite(run.last_loss):
            raise HoneError(
                f"the loss became {run.last_loss} at step {self.step}",
                "lower train.lr, or use model.dtype = bfloat16 instead of float16",
            )
        every_eval = config.train.eval_every
        if (data.eval is not None or self.samples is not None) and every_eval and self.step % every_eval == 0:
            yield from self._evaluate(run)
        every = config.output.checkpoint_every
        # every process agrees on a save by time (each has its own clock; a save is a collective with several)
        timed = run.saves.every_s > 0 and distributed.any_process(run.saves.due(), self.world)
        due = (every and self.step % every == 0) or timed
        if due and self.step < run.total:
            yield self._emit(self._checkpoint(run, run.position))

    def _evaluate(self, run: PreparedRun) -> Events:
        """The sample prompts' answers (samples.jsonl, before the EvalMetrics a reader takes as its cue), then the
        evaluation loss where the run has evaluation rows."""
        if self.samples is not None:
            self.samples.record(run.model, self.step)
        if run.data.eval is None:
            return
        run.eval_loss = run.step_loop.evaluate(run.data.eval)
        yield self._emit(events.EvalMetrics(step=self.step, loss=run.eval_loss, tokens=int(run.data.eval.num_trained)))

    # ---- finish: evaluate, save, report ----
    def _finish(self, run: PreparedRun, stopped: bool) -> Events:
        every_eval = run.config.train.eval_every
        evaluates = run.data.eval is not None or self.samples is not None
        if evaluates and not stopped and (not every_eval or self.step % every_eval):
            yield from self._evaluate(run)
        run.step_loop.close()  # the model as it was loaded again (embedding table back on the device) for the saves
        with self.saving:  # until the run says it ended: a stop out of time ends the process after this, not in it
            yield from self._save_and_report(run, stopped)

    def _save_and_report(self, run: PreparedRun, stopped: bool) -> Events:
        yield self._emit(self._checkpoint(run, run.position))
        adapter_dir = run.run_dir / ADAPTER_DIR
        last_loss = run.last_loss
        if self.world.main:
            save_adapter(
                run.model,
                run.tokenizer,
                adapter_dir,
                run.config,
                steps=self.step,
                final_loss=None if math.isnan(last_loss) else last_loss,
            )
        distributed.finish_together(self.world)
        yield self._emit(
            events.RunFinished(
                step=self.step,
                run_dir=str(run.run_dir),
                adapter_dir=str(adapter_dir),
                final_loss=last_loss,
                elapsed=time.time() - run.started,
                stopped=stopped,
                eval_loss=run.eval_loss,
            )
        )

    def _checkpoint(self, run: PreparedRun, position: int) -> events.CheckpointSaved:
        """Process 0 saves; with several processes the checkpoint holds each one's random state."""
        world = self.world
        rng_by_rank = distributed.gather(ckpt.rng_state(), world) if world.launched else None
        if run.saves is not None:
            run.saves.saved()
        if not world.main:
            return events.CheckpointSaved(step=self.step, path="")
        with self.saving:
            path = ckpt.save_checkpoint(
                run.run_dir,
                self.step,
                run.model,
                run.optimizer,
                run.scheduler,
                {"position": position, "split": self.split, "processes": world.size, **self.facts.record(position)}
                | _objective_state(self.objective),
                scaler=run.scaler,
                keep=self.config.output.keep_checkpoints,
                rng_by_rank=rng_by_rank,
                objective_tensors=_objective_tensors(self.objective),
            )
        return events.CheckpointSaved(step=self.step, path=str(path))


def _objective_tensors(objective) -> dict | None:
    """What a checkpoint keeps of the objective in tensors (`checkpoint_tensors`: GRPO's answers inside a cycle)."""
    checkpoint_tensors = getattr(objective, "checkpoint_tensors", None)
    return checkpoint_tensors() if checkpoint_tensors is not None else None


def _objective_state(objective) -> dict:
    """What a checkpoint keeps of the run's objective (`checkpoint_state`: KTO's latest rewards), where it keeps any."""
    checkpoint_state = getattr(objective, "checkpoint_state", None)
    return {"objective": checkpoint_state()} if checkpoint_state is not None else {}

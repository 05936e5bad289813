"""Settling a run before step 1, once: the part of `Trainer` (trainer.py) that runs before the loop.

`RunPreparation._prepare` settles the config as it will train (the step shared among processes, the memory fit, a
resume's pack order, packing where the model allows it), loads the model with its speed paths and LoRA and the data,
builds the optimizer and finds where a resume starts. Everything the loop reads is on the `PreparedRun` it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hone.core import events
from hone.core.config import RunConfig
from hone.core.data import TrainingData
from hone.core.data.template import apply_template_setting
from hone.core.errors import HoneError
from hone.core.model_info import ModelInfo
from hone.core.models.load import load_model, pending_conversion, resolve_dtype
from hone.core.speed.attention import packing_blocker
from hone.core.speed.graph_choice import settings_blocker
from hone.core.speed.paths import SpeedSetup, install_attention_and_experts, install_memory_and_kernels
from hone.core.train import checkpoints as ckpt
from hone.core.train import distributed, preflight, sharding
from hone.core.train.interruptions import CheckpointClock, checkpoint_notice
from hone.core.train.lora import apply_lora
from hone.core.train.objectives import build_objective
from hone.core.train.objectives.base import ObjectiveSetup
from hone.core.train.optim import build_optimizer, build_scheduler
from hone.core.train.provenance import write_provenance
from hone.core.train.reporting import check_reporters, open_reporters
from hone.core.train.run_dir import RunWriter, new_run_dir
from hone.core.train.run_facts import RunFacts
from hone.core.train.step import PackStream, StepRunner

Events = Generator[events.Event, None, Any]  # a part of the run: yields events, returns its result


def total_steps_for(config: RunConfig, stream: PackStream) -> int:
    t = config.train
    if t.max_steps:
        return t.max_steps
    full, fraction = int(t.epochs), t.epochs - int(t.epochs)
    packs = sum(len(stream.plan(e)) for e in range(full)) + math.ceil(fraction * len(stream.plan(full)))
    return max(1, math.ceil(packs / t.grad_accum))


@dataclass
class PreparedRun:
    """The run as `Trainer._prepare` settled it: everything the loop and the finish read.

    Attributes:
        config: the config the run trains with, final (nothing rewrites it once the loop starts).
        position: packs taken so far (the stream's position: a resume continues from it).
        notices_seen: how many of `setup.notices` are already out (speed paths may add some mid-run).
    """

    config: RunConfig
    run_dir: Path
    model: Any
    tokenizer: Any
    info: ModelInfo
    data: TrainingData
    setup: SpeedSetup
    params: list
    stream: PackStream
    total: int
    optimizer: Any
    scheduler: Any
    scaler: Any
    dtype: torch.dtype
    lora_report: Any
    position: int = 0
    notices_seen: int = 0
    step_loop: StepRunner | None = None
    started: float = 0.0  # time.time() when the loop began
    saves: CheckpointClock | None = None  # when a checkpoint by time is due (output.checkpoint_minutes)
    last_loss: float = math.nan
    eval_loss: float | None = None


class RunPreparation:
    """The prepare part of `Trainer`: each method reads and sets the Trainer's own attributes (`Trainer.__init__`
    says what each holds) and emits through `Trainer._emit`; it holds no state of its own."""

    def _prepare(self) -> Events:
        """Everything before step 1, in order; returns the PreparedRun the loop reads."""
        if self.world.launched:
            self.device = distributed.join(self.world)
        run_dir = yield from self._open_run()
        if self.objective is None:
            self.objective = build_objective(self.config.train.method, self.config)
        torch.manual_seed(self.config.train.seed)
        model, tokenizer, info, data = yield from self._load_model_and_data()
        run = yield from self._build_run(run_dir, model, tokenizer, info, data)
        if self.resume_dir is not None:
            yield from self._resume(run)
        self.reporters = open_reporters(run.config, run_dir, resumed_from=self.step) if self.world.main else []
        yield self._emit(self._run_started(run))
        yield self._emit(checkpoint_notice(run.config.output))
        run.step_loop = self.step_loop = StepRunner(
            run.model,
            run.tokenizer,
            run.optimizer,
            run.scheduler,
            run.scaler,
            run.params,
            run.config,
            self.device,
            run.dtype,
            run.setup,
            world=self.world,
            sharded=self.sharded,
            objective=self.objective,
        )
        yield from self._prepare_objective(run)
        measure = self.memory is not None and self.memory_meter is not None and run.config.train.fit_memory
        if measure and self.step < run.total:
            yield self._emit(self._preflight(run.step_loop, run.data.train, run.stream))
        return run

    def _prepare_objective(self, run: PreparedRun) -> Events:
        """The objective's own step before step 1, where it has one (DPO and KTO: the reference log-probabilities,
        computed once or read from the data cache); its notices, and a stop asked for meanwhile, as the loop's."""
        prepare = getattr(self.objective, "prepare", None)
        if prepare is None:
            return
        grad_accum = run.config.train.grad_accum
        setup = ObjectiveSetup(
            config=run.config,
            model=run.model,
            data=run.data,
            steps=run.step_loop,
            stream=run.stream,
            positions=range(run.position, run.position + max(run.total - self.step, 0) * grad_accum),
            world=self.world,
            stop_requested=lambda: self.control.stop_requested,
            dtype=run.dtype,
        )
        for notice in prepare(setup):
            yield self._emit(notice)

    def _open_run(self) -> Events:
        """The run folder (new, or the one resumed), its writer, and the config settled before anything loads."""
        world = self.world
        as_given, config, notices = self._settle_config()
        check_reporters(config)  # a reporter that is not installed: said before anything is written
        if world.main:
            run_dir = self.resume_dir or new_run_dir(config)
            # config.toml records the config as given (its step shared among processes); the fit is redone each start
            self.writer = RunWriter(run_dir, as_given, created=self.resume_dir is None)  # locks the folder
            self.writer.log(f"run folder {run_dir}, device {self.device}")
            write_provenance(run_dir, config, str(self.device), log=self.writer.log)  # what the run is made from
        run_dir = Path(distributed.from_main(str(run_dir) if world.main else None, world))
        for notice in notices["shared"]:
            yield self._emit(notice)
        if world.main:
            for notice in self.facts.start(run_dir):  # a resume: what changed from which step; config.toml up to date
                yield self._emit(notice)
        for notice in notices["fit"] + notices["pack order"]:
            yield self._emit(notice)
        self.config = config
        return run_dir

    def _settle_config(self) -> tuple[RunConfig, RunConfig, dict[str, list[events.Notice]]]:
        """The config the run trains with, from the one given, in one place: a new run's step shared among the
        processes, then the memory fit, then a resume's pack order (which wins over what the fit picks). RunConfig
        checks itself on each change (a row must fit a micro-batch). Returns the config as given with its step shared,
        the settled one, and each change's notices."""
        config, shared = self.config, None
        if self.resume_dir is None:  # a resume goes on with the micro-batches its config.toml records
            config, shared = distributed.share_step(config, self.world)
        as_given = config
        # Hashes the data; a resume that would change what the run trains is refused here, before any write.
        self.facts = RunFacts(config, self.resume_dir, self.data_changed)
        fit: list[events.Notice] = []
        if config.train.fit_memory:
            config, fit = self._fit_memory(config)
            if self.device.startswith("cuda"):
                self.memory_meter = self.memory_meter or preflight.CudaMeter()
        config, kept = self.facts.keep_pack_order(config)  # a resume packs rows as the run did
        return as_given, config, {"shared": [shared] if shared is not None else [], "fit": fit, "pack order": kept}

    def _load_model_and_data(self) -> Events:
        """The model and tokenizer (converted once from GGUF), the chat template, packing where the model allows
        it, and the training data (tokenized by process 0; the others read its cache)."""
        config, world = self.config, self.world
        converting = pending_conversion(config.model)
        if converting is not None:  # a minute or more of silence otherwise, on a first run with a GGUF model
            yield self._emit(
                events.Notice(
                    topic="model",
                    message=(
                        f"converting {converting.name} to a safetensors folder, once (later runs read the cached copy)"
                    ),
                )
            )
        with distributed.main_first(world) if converting is not None else contextlib.nullcontext():
            loaded = load_model(config.model, device=self.device, qlora=config.lora.qlora)
        template = apply_template_setting(loaded.tokenizer, config.data.chat_template)
        if template:
            yield self._emit(events.Notice(topic="template", message=template))
        unpackable = packing_blocker(loaded.model) if config.speed.packing else None
        if unpackable:
            config = self.config = dataclasses.replace(config, speed=dataclasses.replace(config.speed, packing=False))
            yield self._emit(
                events.Notice(
                    topic="packing", level="warning", message=(f"rows are padded instead of packed: {unpackable}")
                )
            )
        with distributed.main_first(world):  # process 0 tokenizes and caches; the others read the cache
            data = self.objective.load_data(config, loaded.tokenizer)
        for report in data.reports:
            yield self._emit(report)
        if len(data.train) == 0:
            raise HoneError("no usable training rows", "see the dataset report above for why rows were skipped")
        return loaded.model, loaded.tokenizer, loaded.info, data

    def _build_run(self, run_dir: Path, model, tokenizer, info: ModelInfo, data: TrainingData) -> Events:
        """Speed paths and LoRA on the model, how the processes share it, the pack stream, the optimizer."""
        config, device, world = self.config, self.device, self.world
        setup = install_attention_and_experts(model, config.speed, info, device)
        torch.manual_seed(config.train.seed)  # LoRA init must not depend on what loading consumed
        model, lora_report = apply_lora(model, config.lora, info)
        self.model, self.tokenizer = model, tokenizer
        install_memory_and_kernels(
            model,
            config.speed,
            info,
            device,
            setup,
            mean_row_tokens=float(data.train.lengths.mean()),
            graphs_blocker=settings_blocker(config, world.size),
        )
        setup.choices["lora"] = lora_report.summary()
        choose_sampler = getattr(self.objective, "choose_sampler", None)
        if choose_sampler is not None:  # methods that sample their own answers (GRPO)
            setup.choices["sampling"] = choose_sampler(model, setup.note)
        for note in lora_report.notes:
            yield self._emit(events.Notice(topic="lora", level="warning", message=note))
        for notice in setup.notices:
            yield self._emit(notice)
        params = [p for p in model.parameters() if p.requires_grad]
        distributed.same_start(params, world)
        yield from self._choose_parallel(model, info, setup)
        stream = PackStream(
            data.train.lengths,
            config.train.batch_tokens,
            config.train.seed,
            config.speed.packing,
            # GRPO's grpo.num_iterations: each step's prompts come again for as many optimizer steps
            repeat_steps=getattr(self.objective, "updates_per_batch", 1),
            grad_accum=config.train.grad_accum,
        )
        total = total_steps_for(config, stream)
        optimizer = build_optimizer(params, config.train, device)
        scheduler = build_scheduler(optimizer, config.train, total)
        dtype = resolve_dtype(config.model.dtype, device)
        scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
        if scaler is not None and hasattr(optimizer, "clip_grad_norm_"):
            raise HoneError(
                "train.optimizer = adamw-bf16 does not work with float16 weights (the loss scaler "
                "needs per-parameter gradients)",
                "use model.dtype = bfloat16, or train.optimizer = adamw",
            )
        self.facts.attach(stream, data.train, total, tokenizer)
        return PreparedRun(
            config,
            run_dir,
            model,
            tokenizer,
            info,
            data,
            setup,
            params,
            stream,
            total,
            optimizer,
            scheduler,
            scaler,
            dtype,
            lora_report,
            notices_seen=len(setup.notices),
        )

    def _choose_parallel(self, model, info: ModelInfo, setup: SpeedSetup) -> Events:
        """Data parallel or frozen weights split across the processes (train.parallel), once the trainable weights
        are the same everywhere: they stay whole."""
        config, world = self.config, self.world
        parallel, why = sharding.choose(config, world, is_vision=info.is_vision, fits_whole=self.fits_whole)
        self.sharded = parallel == "fsdp"
        if self.sharded:
            setup.choices["parallel"] = f"{sharding.shard_frozen_weights(model, world, self.device)} ({why})"
        elif world.launched and world.size > 1:
            setup.choices["parallel"] = f"data parallel over {world.size} processes, the whole model on each ({why})"
        elif config.train.parallel == "fsdp":
            yield self._emit(
                events.Notice(
                    topic="parallel",
                    message=(
                        "train.parallel = fsdp splits a model across several processes; this run has one, so the whole "
                        "model stays on it (start several with hone train --gpus N)"
                    ),
                )
            )

    def _resume(self, run: PreparedRun) -> Events:
        """Weights, optimizer and position from the newest complete checkpoint, and what changed since."""
        latest, passed_over = ckpt.resumable_checkpoint(run.run_dir)
        for message in passed_over:  # newer checkpoints that are incomplete or damaged
            yield self._emit(events.Notice(topic="resume", message=message, level="warning"))
        if latest is None:
            yield self._emit(
                events.Notice(
                    topic="resume",
                    level="warning",
                    message=("no complete checkpoint found; starting this run from step 0"),
                )
            )
        else:
            state = ckpt.load_checkpoint(
                latest, run.model, run.optimizer, run.scheduler, scaler=run.scaler, rank=self.world.rank
            )
            self.step, run.position = state["step"], state["position"]
            notice = self._process_count_notice(int(state.get("processes", 1)))
            if notice is not None:
                yield self._emit(notice)
            self.split = state.get("split", 1)  # a run that ran out of memory goes on as it ended
            if "objective" in state and hasattr(self.objective, "load_checkpoint_state"):  # e.g. KTO's latest rewards
                self.objective.load_checkpoint_state(state["objective"])
            if "objective_tensors" in state and hasattr(self.objective, "load_checkpoint_tensors"):  # GRPO's answers
                self.objective.load_checkpoint_tensors(state["objective_tensors"])
            resumed = self.facts.resume(state, run.stream, run.optimizer, run.scheduler, run.config)
            run.position, run.total = resumed.position, resumed.total
            for notice in resumed.notices:  # changed settings, data
                yield self._emit(notice)
        if self.writer is not None:  # metrics.jsonl: the steps trained again are written again
            self.writer.forget_steps_after(self.step)

    def _process_count_notice(self, trained_by: int) -> events.Notice | None:
        size = self.world.size
        if trained_by == size:
            return None
        return events.Notice(
            topic="resume",
            step=self.step + 1,
            message=(
                f"the run trained on {trained_by} process{'es' if trained_by > 1 else ''} and goes on with {size}: "
                "each step trains the same rows, but the sums run in another order, so the result is close to, not "
                "bit for bit, the run without the change"
            ),
        )

    def _run_started(self, run: PreparedRun) -> events.RunStarted:
        return events.RunStarted(
            run_dir=str(run.run_dir),
            model=run.info.name,
            device=self.device,
            dtype=str(run.dtype).replace("torch.", ""),
            params_total=run.lora_report.total,
            params_trainable=run.lora_report.trainable,
            total_steps=run.total,
            tokens_per_epoch=int(run.data.train.num_tokens),
            resumed_from_step=self.step,
            is_moe=run.info.is_moe,
            is_vision=run.info.is_vision,
            speed_paths=run.setup.choices,
            config=run.config.to_dict(),
            processes=self.world.size,
        )

    def _fit_memory(self, config: RunConfig) -> tuple[RunConfig, list[events.Notice]]:
        """Auto-fit against the GPU's free memory (system memory on the CPU) before anything loads
        (hone.core.memory): the config to train with and the fit's notices. A planner that cannot read the model
        leaves the config as it is."""
        from hone.core.memory.run_plan import detect_memory, detect_system_memory, fit_run_config

        memory = self.memory = self.memory or (
            detect_memory() if self.device.startswith("cuda") else detect_system_memory()
        )
        if memory is None:
            return config, []
        if self.world.launched:  # every process plans the same batch: the one that fits the tightest of them
            memory = self.memory = distributed.shared_memory(memory, self.device, self.world)
        try:
            fitted = fit_run_config(config, memory, processes=self.world.size)
        except Exception as e:  # the planner is advice: a config it cannot read must not stop the run
            return config, [events.Notice(topic="memory", message=f"no memory estimate ({type(e).__name__}: {e})")]
        self.predicted, self.fits_whole = fitted.predicted, fitted.fits
        return fitted.config, list(fitted.notices)

    def _preflight(self, step_loop: StepRunner, dataset, stream: PackStream) -> events.Notice:
        """Measure the largest micro-batch before step 1 and re-plan once if it does not fit: layers that keep their
        activations are recomputed again first, else the split grows."""
        rows = preflight.largest_micro_batch(dataset, stream.plan(0), self.config.speed.packing)
        first = self.split
        checkpointer = step_loop.setup.offload

        def give_up() -> str:
            kept = checkpointer.recompute_every_layer() if checkpointer is not None else 0
            if not kept:
                return ""
            which = (
                "the last layer no longer keeps its" if kept == 1 else f"the last {kept} layers no longer keep their"
            )
            return f"{which} activations (recomputed instead)"

        result = preflight.run_preflight(
            step_loop, rows, available=self.memory.available, split=first, meter=self.memory_meter, give_up=give_up
        )
        self.split = result.split
        return preflight.preflight_notice(result, self.predicted, first)

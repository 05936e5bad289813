"""The training loop: explicit, one screen for the step itself, events out.

`Trainer(config).run()` is a generator of events (hone.core.events); every event is also appended to the
run folder's metrics.jsonl. Failures become a RunFailed event with advice, never an exception out of run().
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from hone.core import events
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.data import load_training_data, packing_efficiency
from hone.core.data.template import apply_template_setting
from hone.core.errors import HoneError
from hone.core.models.load import load_model, pending_conversion, pick_device, resolve_dtype
from hone.core.speed import install_attention_and_experts, install_memory_and_kernels
from hone.core.speed.attention import packing_blocker
from hone.core.train import checkpoints as ckpt
from hone.core.train import distributed, preflight, sharding
from hone.core.train.adapter_dir import save_adapter
from hone.core.train.lora import apply_lora
from hone.core.train.optim import build_optimizer, build_scheduler
from hone.core.train.reporting import check_reporters, close_reporters, open_reporters
from hone.core.train.resume_checks import RunFacts
from hone.core.train.run_dir import ADAPTER_DIR, RunWriter, new_run_dir
from hone.core.train.step import PackStream, StepRunner, split_packs

OOM_ADVICE = ("lower train.batch_tokens, set speed.checkpoint = offload, or turn on lora.qlora (`hone plan RUN.toml` "
              "says what fits)")


def _host_out_of_memory(error: Exception) -> bool:
    """torch's CPU allocator failing (Linux, Windows); an out-of-memory kill by the system cannot be caught."""
    text = str(error)
    return isinstance(error, MemoryError) or (isinstance(error, RuntimeError)
                                              and ("DefaultCPUAllocator" in text or "not enough memory" in text))


def total_steps_for(config: RunConfig, stream: PackStream) -> int:
    t = config.train
    if t.max_steps:
        return t.max_steps
    full, fraction = int(t.epochs), t.epochs - int(t.epochs)
    packs = sum(len(stream.plan(e)) for e in range(full)) + math.ceil(fraction * len(stream.plan(full)))
    return max(1, math.ceil(packs / t.grad_accum))


class Trainer:
    """Runs one fine-tuning run. `resume_dir` continues a run from its newest complete checkpoint; `data_changed`
    (refuse | restart-epoch | continue) says what to do when its training files changed since (resume_checks)."""

    def __init__(self, config: RunConfig, control: RunControl | None = None, *, resume_dir: str | Path | None = None,
                 device: str | None = None, data_changed: str = "refuse", world: distributed.World | None = None):
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
        self.tokenizer = None

    # ---- events ----
    def _emit(self, event: events.Event) -> events.Event:
        if self.writer is not None:
            self.writer.write(event)  # metrics.jsonl, and train.log in words
        for reporter in self.reporters:  # output.report_to: TensorBoard, W&B
            reporter.report(event)
        return event

    def run(self) -> Iterator[events.Event]:
        """Run the whole fine-tuning run, yielding its events; nothing escapes (failures become RunFailed).

        For each optimizer step: micro-batches (packed rows) -> forward -> summed token loss -> backward (scaled by
        1 / trained tokens of the whole step, so the loss is token-weighted across micro-batches) -> clip ->
        optimizer -> scheduler -> StepMetrics event.
        """
        try:
            yield from self._run()
        except HoneError as e:
            yield self._emit(events.RunFailed(reason=e.message, advice=e.advice, step=self.step, code=e.code))
        except torch.OutOfMemoryError:
            used = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
            yield self._emit(events.RunFailed(
                reason=f"the GPU ran out of memory at step {self.step} ({used:.1f} GiB in use)",
                advice=OOM_ADVICE,
                step=self.step, details=traceback.format_exc()))
        except Exception as e:  # anything else: keep the traceback in the log, tell the user where it is
            if _host_out_of_memory(e):
                reason, advice = (f"the computer ran out of memory at step {self.step} ({e})",
                                  "lower train.batch_tokens or set speed.checkpoint = gpu (recompute); "
                                  "`hone plan RUN.toml` shows what a step needs")
            else:
                reason, advice = f"{type(e).__name__}: {e}", "see train.log in the run folder for the full traceback"
            yield self._emit(events.RunFailed(reason=reason, advice=advice, step=self.step,
                                              details=traceback.format_exc()))
        finally:
            if self.step_loop is not None:
                self.step_loop.close()
            close_reporters(self.reporters)
            self.reporters = []
            if self.writer is not None:
                self.writer.close()
            if self.world.launched:
                distributed.leave()

    # ---- the run ----
    def _run(self) -> Iterator[events.Event]:
        world = self.world
        if world.launched:
            self.device = distributed.join(world)
        config, device = self.config, self.device
        shared = None
        if self.resume_dir is None:  # a resume goes on with the micro-batches its config.toml records
            config, shared = distributed.share_step(config, world)
            self.config = config
        # Hashes the data; a resume that would change what the run trains is refused here, before any write.
        facts = self.facts = RunFacts(config, self.resume_dir, self.data_changed)
        check_reporters(config)  # a reporter that is not installed: said before anything is written
        if world.main:
            run_dir = self.resume_dir or new_run_dir(config)
            self.writer = RunWriter(run_dir, config, created=self.resume_dir is None)  # locks the folder for the run
            self.writer.log(f"run folder {run_dir}, device {device}")
        run_dir = Path(distributed.from_main(str(run_dir) if world.main else None, world))
        if shared is not None:
            yield self._emit(shared)
        if world.main:
            for notice in facts.start(run_dir):  # a resume: what changed from which step; config.toml up to date
                yield self._emit(notice)
        if config.train.fit_memory:
            config = self.config = yield from self._fit_memory(config)
            if device.startswith("cuda"):
                self.memory_meter = self.memory_meter or preflight.CudaMeter()
        config, notices = facts.keep_pack_order(config)  # a resume packs rows as the run did, whatever the fit picks
        self.config = config
        for notice in notices:
            yield self._emit(notice)
        torch.manual_seed(config.train.seed)

        converting = pending_conversion(config.model)
        if converting is not None:  # a minute or more of silence otherwise, on a first run with a GGUF model
            yield self._emit(events.Notice(topic="model", message=(
                f"converting {converting.name} to a safetensors folder, once (later runs read the cached copy)")))
        with distributed.main_first(world) if converting is not None else contextlib.nullcontext():
            loaded = load_model(config.model, device=device, qlora=config.lora.qlora)
        model, tokenizer, info = loaded.model, loaded.tokenizer, loaded.info
        template = apply_template_setting(tokenizer, config.data.chat_template)
        if template:
            yield self._emit(events.Notice(topic="template", message=template))
        unpackable = packing_blocker(model) if config.speed.packing else None
        if unpackable:
            config = self.config = dataclasses.replace(config, speed=dataclasses.replace(config.speed, packing=False))
            yield self._emit(events.Notice(topic="packing", level="warning", message=(
                f"rows are padded instead of packed: {unpackable}")))
        with distributed.main_first(world):  # process 0 tokenizes and caches; the others read the cache
            data = load_training_data(config.data, tokenizer, seed=config.train.seed)
        for report in data.reports:
            yield self._emit(report)
        if len(data.train) == 0:
            raise HoneError("no usable training rows", "see the dataset report above for why rows were skipped")
        if config.data.max_length > config.train.batch_tokens and config.speed.packing:
            raise HoneError(f"data.max_length ({config.data.max_length}) is larger than train.batch_tokens "
                            f"({config.train.batch_tokens}), so a long row would not fit one micro-batch",
                            "raise train.batch_tokens or lower data.max_length")

        setup = install_attention_and_experts(model, config.speed, info, device)
        torch.manual_seed(config.train.seed)  # LoRA init must not depend on what loading consumed
        model, lora_report = apply_lora(model, config.lora, info)
        self.model, self.tokenizer = model, tokenizer
        install_memory_and_kernels(model, config.speed, info, device, setup,
                                   mean_row_tokens=float(data.train.lengths.mean()))
        setup.choices["lora"] = lora_report.summary()
        for note in lora_report.notes:
            yield self._emit(events.Notice(topic="lora", level="warning", message=note))
        for notice in setup.notices:
            yield self._emit(notice)
        emitted = len(setup.notices)

        params = [p for p in model.parameters() if p.requires_grad]
        distributed.same_start(params, world)
        parallel, why = sharding.choose(config, world, is_vision=info.is_vision, fits_whole=self.fits_whole)
        self.sharded = parallel == "fsdp"
        if self.sharded:  # after the trainable weights are the same everywhere: they stay whole (not split)
            setup.choices["parallel"] = f"{sharding.shard_frozen_weights(model, world, device)} ({why})"
        elif world.launched and world.size > 1:
            setup.choices["parallel"] = f"data parallel over {world.size} processes, the whole model on each ({why})"
        elif config.train.parallel == "fsdp":
            yield self._emit(events.Notice(topic="parallel", message=(
                "train.parallel = fsdp splits a model across several processes; this run has one, so the whole "
                "model stays on it (start several with hone train --gpus N)")))
        stream = PackStream(data.train.lengths, config.train.batch_tokens, config.train.seed, config.speed.packing)
        total = total_steps_for(config, stream)
        optimizer = build_optimizer(params, config.train, device)
        scheduler = build_scheduler(optimizer, config.train, total)
        dtype = resolve_dtype(config.model.dtype, device)
        scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
        if scaler is not None and hasattr(optimizer, "clip_grad_norm_"):
            raise HoneError("train.optimizer = adamw-bf16 does not work with float16 weights (the loss scaler "
                            "needs per-parameter gradients)", "use model.dtype = bfloat16, or train.optimizer = adamw")

        facts.attach(stream, data.train, total, tokenizer)
        position = 0
        if self.resume_dir is not None:
            latest, passed_over = ckpt.resumable_checkpoint(run_dir)
            for message in passed_over:  # newer checkpoints that are incomplete or damaged
                yield self._emit(events.Notice(topic="resume", message=message, level="warning"))
            if latest is None:
                yield self._emit(events.Notice(topic="resume", message="no complete checkpoint found; "
                                               "starting this run from step 0", level="warning"))
            else:
                state = ckpt.load_checkpoint(latest, model, optimizer, scheduler, scaler=scaler, rank=world.rank)
                self.step, position = state["step"], state["position"]
                trained_by = int(state.get("processes", 1))
                if trained_by != world.size:
                    yield self._emit(events.Notice(topic="resume", step=self.step + 1, message=(
                        f"the run trained on {trained_by} process{'es' if trained_by > 1 else ''} and goes on with "
                        f"{world.size}: each step trains the same rows, but the sums run in another order, so the "
                        "result is close to, not bit for bit, the run without the change")))
                self.split = state.get("split", 1)  # a run that ran out of memory goes on as it ended
                resumed = facts.resume(state, stream, optimizer, scheduler, config)  # changed settings, data
                position, total = resumed.position, resumed.total
                for notice in resumed.notices:
                    yield self._emit(notice)
            if self.writer is not None:  # metrics.jsonl: the steps trained again are written again
                self.writer.forget_steps_after(self.step)

        self.reporters = open_reporters(config, run_dir, resumed_from=self.step) if world.main else []
        yield self._emit(events.RunStarted(
            run_dir=str(run_dir), model=info.name, device=device, dtype=str(dtype).replace("torch.", ""),
            params_total=lora_report.total, params_trainable=lora_report.trainable, total_steps=total,
            tokens_per_epoch=int(data.train.num_tokens), resumed_from_step=self.step, is_moe=info.is_moe,
            is_vision=info.is_vision, speed_paths=setup.choices, config=config.to_dict(), processes=world.size))

        step_loop = self.step_loop = StepRunner(model, tokenizer, optimizer, scheduler, scaler, params, config,
                                                device, dtype, setup, world=world, sharded=self.sharded)
        if self.memory is not None and self.memory_meter is not None and config.train.fit_memory and self.step < total:
            yield self._emit(self._preflight(step_loop, data.train, stream))
        last_loss = self.writer.last_loss if self.writer is not None else math.nan
        start_time, eval_loss, stopped = time.time(), None, False
        while self.step < total:
            if self.control.paused:
                yield self._emit(events.RunPaused(step=self.step))
                self.control.wait_while_paused()
                if not self.control.stop_requested:
                    yield self._emit(events.RunResumed(step=self.step))
            if distributed.any_process(self.control.stop_requested, world):  # every process stops at one step
                stopped = True
                break
            packs = [stream.take(position + i) for i in range(config.train.grad_accum)]
            position += len(packs)
            upcoming = ([stream.take(position + i) for i in range(config.train.grad_accum)]
                        if self.step + 1 < total else None)
            mine, lengths = world.share(packs), data.train.lengths
            counts = (int(sum(lengths[i] for p in packs for i in p)),
                      int(sum(data.train.trained_lengths[i] for p in packs for i in p)))
            while True:  # an out-of-memory step runs again on smaller micro-batches of the same rows
                try:
                    metrics = step_loop.step(data.train, split_packs(mine, lengths, self.split), self.step, total,
                                             next_packs=upcoming and split_packs(world.share(upcoming), lengths,
                                                                                 self.split), counts=counts)
                    break
                except torch.OutOfMemoryError:
                    step_loop.forget_step()
                    if max(len(p) for p in split_packs(mine, lengths, self.split)) == 1:
                        if not world.launched:  # (a save needs every process, and the others are mid-step)
                            yield self._emit(self._checkpoint(run_dir, model, optimizer, scheduler, scaler,
                                                              position - len(packs)))
                        raise HoneError(f"the GPU ran out of memory at step {self.step + 1} even with one row per "
                                        "micro-batch; the run is saved up to the step before", OOM_ADVICE) from None
                    self.split *= 2
                    yield self._emit(events.Notice(topic="memory", level="warning", step=self.step + 1, message=(
                        f"out of GPU memory at step {self.step + 1}: running each micro-batch as {self.split} "
                        "smaller ones from now on (the same rows per step, so the loss curve stays comparable)")))
            self.step += 1
            for notice in setup.notices[emitted:]:  # speed paths may fall back mid-run (e.g. offload buffers)
                yield self._emit(notice)
            emitted = len(setup.notices)
            last_loss = metrics["loss"]
            yield self._emit(events.StepMetrics(
                step=self.step, total_steps=total, epoch=stream.epoch_progress(position),
                elapsed=time.time() - start_time,
                packing_efficiency=packing_efficiency(packs, data.train.lengths, config.train.batch_tokens)
                if config.speed.packing else 1.0, **metrics))
            if not math.isfinite(last_loss):
                raise HoneError(f"the loss became {last_loss} at step {self.step}",
                                "lower train.lr, or use model.dtype = bfloat16 instead of float16")
            if data.eval is not None and config.train.eval_every and self.step % config.train.eval_every == 0:
                eval_loss = step_loop.evaluate(data.eval)
                yield self._emit(events.EvalMetrics(step=self.step, loss=eval_loss,
                                                    tokens=int(data.eval.num_trained)))
            every = config.output.checkpoint_every
            if every and self.step % every == 0 and self.step < total:
                yield self._emit(self._checkpoint(run_dir, model, optimizer, scheduler, scaler, position))

        if data.eval is not None and not stopped and (not config.train.eval_every
                                                      or self.step % config.train.eval_every):
            eval_loss = step_loop.evaluate(data.eval)
            yield self._emit(events.EvalMetrics(step=self.step, loss=eval_loss, tokens=int(data.eval.num_trained)))
        step_loop.close()  # the model as it was loaded again (embedding table back on the device) for the saves
        yield self._emit(self._checkpoint(run_dir, model, optimizer, scheduler, scaler, position))
        adapter_dir = run_dir / ADAPTER_DIR
        if world.main:
            save_adapter(model, tokenizer, adapter_dir, config, steps=self.step,
                         final_loss=None if math.isnan(last_loss) else last_loss)
        distributed.finish_together(world)
        yield self._emit(events.RunFinished(step=self.step, run_dir=str(run_dir), adapter_dir=str(adapter_dir),
                                            final_loss=last_loss, elapsed=time.time() - start_time,
                                            stopped=stopped, eval_loss=eval_loss))

    def _fit_memory(self, config: RunConfig):
        """Auto-fit against the GPU's free memory (system memory on the CPU) before anything loads
        (hone.core.memory); yields its notices and returns the config to train with. A planner that cannot read the
        model leaves the config as it is."""
        from hone.core.memory.run_plan import detect_memory, detect_system_memory, fit_run_config

        memory = self.memory = self.memory or (detect_memory() if self.device.startswith("cuda")
                                               else detect_system_memory())
        if memory is None:
            return config
        if self.world.launched:  # every process plans the same batch: the one that fits the tightest of them
            memory = self.memory = distributed.shared_memory(memory, self.device, self.world)
        try:
            fitted = fit_run_config(config, memory)
        except Exception as e:  # the planner is advice: a config it cannot read must not stop the run
            yield self._emit(events.Notice(topic="memory", message=f"no memory estimate ({type(e).__name__}: {e})"))
            return config
        for notice in fitted.notices:
            yield self._emit(notice)
        self.predicted, self.fits_whole = fitted.predicted, fitted.fits
        return fitted.config

    def _preflight(self, step_loop: StepRunner, dataset, stream: PackStream) -> events.Notice:
        """Measure the largest micro-batch before step 1 and re-plan the split once if it does not fit."""
        rows = preflight.largest_micro_batch(dataset, stream.plan(0), self.config.speed.packing)
        first = self.split
        result = preflight.run_preflight(step_loop, rows, available=self.memory.available, split=first,
                                         meter=self.memory_meter)
        self.split = result.split
        return preflight.preflight_notice(result, self.predicted, first)

    def _checkpoint(self, run_dir, model, optimizer, scheduler, scaler, position) -> events.CheckpointSaved:
        """Process 0 saves; with several processes the checkpoint holds each one's random state."""
        world = self.world
        rng_by_rank = distributed.gather(ckpt.rng_state(), world) if world.launched else None
        if not world.main:
            return events.CheckpointSaved(step=self.step, path="")
        path = ckpt.save_checkpoint(run_dir, self.step, model, optimizer, scheduler,
                                    {"position": position, "split": self.split, "processes": world.size,
                                     **self.facts.record(position)},
                                    scaler=scaler, keep=self.config.output.keep_checkpoints, rng_by_rank=rng_by_rank)
        return events.CheckpointSaved(step=self.step, path=str(path))

"""The training loop: explicit, one screen for the step itself, events out.

    for each optimizer step:
        micro-batches (packed rows) -> forward -> summed token loss -> backward (scaled by 1 / trained tokens of
        the whole step, so the loss is token-weighted across micro-batches) -> clip -> optimizer -> scheduler
        -> StepMetrics event

`Trainer(config).run()` is a generator of events (hone.core.events); every event is also appended to the
run folder's metrics.jsonl. Failures become a RunFailed event with advice, never an exception out of run().
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from hone.core import checkpoint as ckpt
from hone.core import events, vision
from hone.core.adapter import save_adapter
from hone.core.config import RunConfig
from hone.core.control import RunControl
from hone.core.data import TokenizedSet, load_training_data, packing_efficiency, plan_packs
from hone.core.errors import HoneError
from hone.core.lora import apply_lora
from hone.core.loss import loss_sum
from hone.core.models import load_model, pick_device, resolve_dtype
from hone.core.optim import build_optimizer, build_scheduler
from hone.core.packing import collate_packed, collate_padded
from hone.core.runs import ADAPTER_DIR, RunWriter, new_run_dir
from hone.core.speed import after_lora, before_lora
from hone.kernels.weight_casts import reuse_weight_casts


class PackStream:
    """Packs of row indices in training order across epochs; position = packs consumed so far.

    Each epoch's plan is deterministic for (seed, epoch), so a resumed run recomputes the same order and
    continues from the saved position.
    """

    def __init__(self, lengths, budget: int, seed: int, packing: bool):
        self.lengths, self.budget, self.seed, self.packing = lengths, budget, seed, packing
        self._plans: dict[int, list[list[int]]] = {}

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            if self.packing:
                self._plans[epoch] = plan_packs(self.lengths, self.budget, seed=self.seed, epoch=epoch)
            else:  # one row per micro-batch, shuffled per epoch the same way
                order = torch.randperm(len(self.lengths), generator=torch.Generator().manual_seed(
                    self.seed * 1000 + epoch)).tolist()
                self._plans[epoch] = [[i] for i in order]
        return self._plans[epoch]

    def packs_per_epoch(self) -> int:
        return len(self.plan(0))

    def locate(self, position: int) -> tuple[int, int]:
        """(epoch, index within that epoch) of the pack at global `position`."""
        epoch = 0
        while position >= len(self.plan(epoch)):
            position -= len(self.plan(epoch))
            epoch += 1
        return epoch, position

    def take(self, position: int) -> list[int]:
        epoch, index = self.locate(position)
        return self.plan(epoch)[index]

    def epoch_progress(self, position: int) -> float:
        epoch, index = self.locate(position)
        return epoch + index / len(self.plan(epoch))


def total_steps_for(config: RunConfig, stream: PackStream) -> int:
    t = config.train
    if t.max_steps:
        return t.max_steps
    full, fraction = int(t.epochs), t.epochs - int(t.epochs)
    packs = sum(len(stream.plan(e)) for e in range(full)) + math.ceil(fraction * len(stream.plan(full)))
    return max(1, math.ceil(packs / t.grad_accum))


class Trainer:
    """Runs one fine-tuning run. `resume_dir` continues a run from its newest complete checkpoint."""

    def __init__(self, config: RunConfig, control: RunControl | None = None, *, resume_dir: str | Path | None = None,
                 device: str | None = None):
        self.config = config
        self.control = control or RunControl()
        self.resume_dir = Path(resume_dir) if resume_dir else None
        self.device = device or pick_device()
        self.step = 0
        self.writer: RunWriter | None = None
        self.step_loop: StepRunner | None = None
        self.model = None  # the peft model once loaded (tests and the demo read it after the run)
        self.tokenizer = None

    # ---- events ----
    def _emit(self, event: events.Event) -> events.Event:
        if self.writer is not None:
            self.writer.write(event)
            if isinstance(event, (events.Notice, events.RunFailed, events.CheckpointSaved)):
                self.writer.log(f"{type(event).__name__}: {events.to_dict(event)}")
        return event

    def run(self) -> Iterator[events.Event]:
        try:
            yield from self._run()
        except HoneError as e:
            yield self._emit(events.RunFailed(reason=e.message, advice=e.advice, step=self.step))
        except torch.cuda.OutOfMemoryError:
            used = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
            yield self._emit(events.RunFailed(
                reason=f"the GPU ran out of memory at step {self.step} ({used:.1f} GiB in use)",
                advice="lower train.batch_tokens, set speed.checkpoint = offload, or turn on lora.qlora",
                step=self.step, details=traceback.format_exc()))
        except Exception as e:  # anything else: keep the traceback in the log, tell the user where it is
            yield self._emit(events.RunFailed(reason=f"{type(e).__name__}: {e}", step=self.step,
                                              advice="see train.log in the run folder for the full traceback",
                                              details=traceback.format_exc()))
        finally:
            if self.step_loop is not None:
                self.step_loop.close()
            if self.writer is not None:
                self.writer.close()

    # ---- the run ----
    def _run(self) -> Iterator[events.Event]:
        config, device = self.config, self.device
        run_dir = self.resume_dir or new_run_dir(config)
        self.writer = RunWriter(run_dir, config)
        self.writer.log(f"run folder {run_dir}, device {device}")
        torch.manual_seed(config.train.seed)

        loaded = load_model(config.model, device=device, qlora=config.lora.qlora)
        model, tokenizer, info = loaded.model, loaded.tokenizer, loaded.info
        data = load_training_data(config.data, tokenizer, seed=config.train.seed)
        for report in data.reports:
            yield self._emit(report)
        if len(data.train) == 0:
            raise HoneError("no usable training rows", "see the dataset report above for why rows were skipped")
        if config.data.max_length > config.train.batch_tokens and config.speed.packing:
            raise HoneError(f"data.max_length ({config.data.max_length}) is larger than train.batch_tokens "
                            f"({config.train.batch_tokens}), so a long row would not fit one micro-batch",
                            "raise train.batch_tokens or lower data.max_length")

        setup = before_lora(model, config.speed, info, device)
        torch.manual_seed(config.train.seed)  # LoRA init must not depend on what loading consumed
        model, lora_report = apply_lora(model, config.lora, info)
        self.model, self.tokenizer = model, tokenizer
        after_lora(model, config.speed, info, device, setup,
                   mean_row_tokens=float(data.train.lengths.mean()))
        setup.choices["lora"] = lora_report.summary()
        for notice in setup.notices:
            yield self._emit(notice)
        emitted = len(setup.notices)

        params = [p for p in model.parameters() if p.requires_grad]
        stream = PackStream(data.train.lengths, config.train.batch_tokens, config.train.seed, config.speed.packing)
        total = total_steps_for(config, stream)
        optimizer = build_optimizer(params, config.train, device)
        scheduler = build_scheduler(optimizer, config.train, total)
        dtype = resolve_dtype(config.model.dtype, device)
        scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
        if scaler is not None and hasattr(optimizer, "clip_grad_norm_"):
            raise HoneError("train.optimizer = adamw-bf16 does not work with float16 weights (the loss scaler "
                            "needs per-parameter gradients)", "use model.dtype = bfloat16, or train.optimizer = adamw")

        position = 0
        if self.resume_dir is not None:
            latest = ckpt.latest_checkpoint(run_dir)
            if latest is None:
                yield self._emit(events.Notice(topic="resume", message="no complete checkpoint found; "
                                               "starting this run from step 0", level="warning"))
            else:
                state = ckpt.load_checkpoint(latest, model, optimizer, scheduler, scaler=scaler)
                self.step, position = state["step"], state["position"]

        yield self._emit(events.RunStarted(
            run_dir=str(run_dir), model=info.name, device=device, dtype=str(dtype).replace("torch.", ""),
            params_total=lora_report.total, params_trainable=lora_report.trainable, total_steps=total,
            tokens_per_epoch=int(data.train.num_tokens), resumed_from_step=self.step, is_moe=info.is_moe,
            is_vision=info.is_vision, speed_paths=setup.choices, config=config.to_dict()))

        step_loop = self.step_loop = StepRunner(model, tokenizer, optimizer, scheduler, scaler, params, config,
                                                device, dtype, setup)
        start_time, last_loss, eval_loss, stopped = time.time(), float("nan"), None, False
        while self.step < total:
            if self.control.paused:
                yield self._emit(events.RunPaused(step=self.step))
                self.control.wait_while_paused()
                if not self.control.stop_requested:
                    yield self._emit(events.RunResumed(step=self.step))
            if self.control.stop_requested:
                stopped = True
                break
            packs = [stream.take(position + i) for i in range(config.train.grad_accum)]
            position += len(packs)
            upcoming = ([stream.take(position + i) for i in range(config.train.grad_accum)]
                        if self.step + 1 < total else None)
            metrics = step_loop.step(data.train, packs, self.step, total, next_packs=upcoming)
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
        adapter_dir = save_adapter(model, tokenizer, run_dir / ADAPTER_DIR, config, steps=self.step,
                                   final_loss=None if math.isnan(last_loss) else last_loss)
        yield self._emit(events.RunFinished(step=self.step, run_dir=str(run_dir), adapter_dir=str(adapter_dir),
                                            final_loss=last_loss, elapsed=time.time() - start_time,
                                            stopped=stopped, eval_loss=eval_loss))

    def _checkpoint(self, run_dir, model, optimizer, scheduler, scaler, position) -> events.CheckpointSaved:
        path = ckpt.save_checkpoint(run_dir, self.step, model, optimizer, scheduler, {"position": position},
                                    scaler=scaler, keep=self.config.output.keep_checkpoints)
        return events.CheckpointSaved(step=self.step, path=str(path))


class StepRunner:
    """One optimizer step and evaluation; holds what every step needs."""

    PREFETCH_ON_CPU = False  # tests switch background collation on without a GPU

    def __init__(self, model, tokenizer, optimizer, scheduler, scaler, params, config: RunConfig, device: str,
                 dtype, setup):
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.params, self.config, self.device, self.setup = params, config, device, setup
        self.cuda = str(device).startswith("cuda")
        self.autocast_dtype = dtype if self.cuda and dtype != torch.float32 else None
        text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self.pad_id = text_tokenizer.pad_token_id
        self.pin = self.cuda
        # On a GPU the next step's batches are collated on a background thread while this step computes (image
        # rows cost 0.1-0.3 s per 8K-token batch to decode and resize); on the CPU that thread would only compete
        # with the step for cores.
        self.prefetch = self.cuda or self.PREFETCH_ON_CPU
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, list[list[int]], Future] | None = None
        self.vision = None  # vision-language models: batches carry pixels next to the ids (hone.core.vision)
        if vision.is_vision_processor(tokenizer):
            self.vision = vision.collator_for(model, tokenizer, config, dtype)
            setup.note("vision", f"vision batches: {self.vision.describe()}")

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.autocast_dtype)

    def collate(self, rows):
        """One micro-batch on the host (pinned on a GPU), with its embedding rows when the table lives there."""
        if self.vision is not None:
            return self.vision.collate(rows, pin_memory=self.pin)
        if self.config.speed.packing:
            batch = collate_packed(rows, pin_memory=self.pin)
        else:
            batch = collate_padded(rows, pad_id=self.pad_id, pin_memory=self.pin)
        host = getattr(self.setup.host_tables, "embedding", None)
        if host is not None and not isinstance(host, str):
            batch.input_rows = host.rows(batch.input_ids, pin_memory=self.pin)
        return batch

    def _collate_packs(self, dataset: TokenizedSet, packs: list[list[int]]) -> list:
        return [self.collate([dataset[i] for i in pack]) for pack in packs]

    def _batches(self, dataset: TokenizedSet, packs: list[list[int]], next_packs: list[list[int]] | None) -> list:
        """This step's batches (collated ahead when the last step asked for exactly these), and the next step's
        collation started in the background. A collation error surfaces here, in the step that needs it."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == id(dataset) and pending[1] == packs:
            batches = pending[2].result()
        else:
            if pending is not None:
                pending[2].cancel()
            batches = self._collate_packs(dataset, packs)
        if self.prefetch and next_packs:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hone-collate")
            self._pending = (id(dataset), next_packs, self._pool.submit(self._collate_packs, dataset, next_packs))
        return batches

    def close(self) -> None:
        """Stop the background collation thread and put the vocabulary tables back on the device (a run's end)."""
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.setup.host_tables is not None:
            self.setup.host_tables.restore(self.model)

    def step(self, dataset: TokenizedSet, packs: list[list[int]], step: int, total: int,
             next_packs: list[list[int]] | None = None) -> dict:
        """Run one optimizer step over `packs` (one micro-batch each); returns StepMetrics fields. `next_packs`,
        the packs of the step after, are collated in the background meanwhile (on a GPU)."""
        model, cfg = self.model, self.config.train
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        batches = self._batches(dataset, packs, next_packs)
        trained = sum(b.num_trained for b in batches)  # known on the CPU: no sync to normalize the loss
        tokens = sum(b.num_tokens for b in batches)
        loss_total = torch.zeros((), device=self.device, dtype=torch.float32)
        if not model.training:  # model.train() visits every module: thousands of calls on each step otherwise
            model.train()
        with reuse_weight_casts():  # the adapters change only at the optimizer step below
            for batch in batches:
                batch = batch.to(self.device)
                with self._autocast():
                    summed = loss_sum(model, batch, mode=self.config.speed.loss, fused=self.config.speed.kernels)
                # Backward needs none of the batch's device tensors (the graph keeps what it uses): the embedding
                # rows a host table supplies (T x H) must not stay allocated through it.
                batch = None
                scaled = summed / max(trained, 1)
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                loss_total += summed.detach()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        own_clip = getattr(self.optimizer, "clip_grad_norm_", None)  # FlatAdamW keeps the gradients in its buffer
        grad_norm = own_clip(max_norm) if own_clip else torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_total.item() / max(trained, 1)  # the step's one deliberate sync, after all GPU work is queued
        if self.cuda:
            torch.cuda.synchronize()
        step_time = time.perf_counter() - started
        if self.setup.compile is not None and (compiling := self.setup.compile.take_new_seconds()):
            # compilation happens inside the first steps; report it once and keep it out of the step's rate
            step_time = max(step_time - compiling, 1e-6)
            self.setup.note("compile", f"compiled decoder blocks in {compiling:.1f} s (not counted in step times)")
        out = dict(loss=loss, lr=lr, grad_norm=float(grad_norm), tokens=tokens, trained_tokens=trained,
                   tokens_per_s=tokens / step_time, step_time=step_time)
        if self.cuda:
            out.update(mem_allocated=torch.cuda.max_memory_allocated(), mem_reserved=torch.cuda.memory_reserved())
        if self.setup.expert_meter is not None:
            out["expert_load"] = self.setup.expert_meter.read_and_reset()
        if self.setup.offload is not None:
            out.update(self.setup.offload.read_and_reset())
        return out

    @torch.no_grad()
    def evaluate(self, dataset: TokenizedSet) -> float:
        """Mean loss over every trained token of the evaluation rows."""
        model = self.model
        model.eval()
        stream = PackStream(dataset.lengths, self.config.train.batch_tokens, 0, self.config.speed.packing)
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        trained = 0
        with reuse_weight_casts():
            for pack in stream.plan(0):
                batch = self.collate([dataset[i] for i in pack])
                trained += batch.num_trained
                with self._autocast():
                    total += loss_sum(model, batch.to(self.device), mode=self.config.speed.loss).float()
        model.train()
        return total.item() / max(trained, 1)

"""One optimizer step and evaluation (`StepRunner`), and the order packs are taken in across epochs (`PackStream`).

A step collates its micro-batches (the next step's on a background thread on a GPU), runs forward, the summed loss
of the run's objective (hone.core.train.objectives) and backward for each, then clips, steps the optimizer and the
scheduler, and returns the numbers a StepMetrics event carries. The loss is normalized by the units (SFT: trained
tokens) the batches count on the CPU.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hone.core import vision
from hone.core.config import RunConfig
from hone.core.data import TokenizedSet, plan_packs
from hone.core.data.collate import collate_packed, collate_padded
from hone.core.train import distributed
from hone.core.train.objectives import Objective, SupervisedFineTuning
from hone.kernels.weight_casts import reuse_weight_casts


class PackStream:
    """Packs of row indices in training order across epochs; position = packs consumed so far.

    Each epoch's plan is deterministic for (seed, epoch), so a resumed run recomputes the same order and
    continues from the saved position. `repeat_steps` > 1 (GRPO's grpo.num_iterations): each step's packs (`grad_accum`
    of them) come `repeat_steps` times in a row, so as many optimizer steps train on one batch of sampled answers,
    and an epoch is that many times longer.
    """

    def __init__(self, lengths, budget: int, seed: int, packing: bool, *, repeat_steps: int = 1, grad_accum: int = 1):
        self.lengths, self.budget, self.seed, self.packing = lengths, budget, seed, packing
        self.repeat_steps, self.grad_accum = repeat_steps, grad_accum
        self._plans: dict[int, list[list[int]]] = {}

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            if self.packing:
                packs = plan_packs(self.lengths, self.budget, seed=self.seed, epoch=epoch)
            else:  # one row per micro-batch, shuffled per epoch the same way
                order = torch.randperm(
                    len(self.lengths), generator=torch.Generator().manual_seed(self.seed * 1000 + epoch)
                ).tolist()
                packs = [[i] for i in order]
            self._plans[epoch] = repeat_steps(packs, self.grad_accum, self.repeat_steps)
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


def repeat_steps(packs: list[list[int]], grad_accum: int, times: int) -> list[list[int]]:
    """An epoch's packs in steps of `grad_accum`, each step's packs given `times` times in a row. With `times` > 1, a
    last step short of packs takes them from the epoch's start, so every step is whole and steps never straddle two
    epochs or two repeats (no row is left out of the epoch; a few are seen in two steps' batches)."""
    if times <= 1:
        return packs
    out = []
    for start in range(0, len(packs), grad_accum):
        step = [packs[(start + i) % len(packs)] for i in range(grad_accum)]
        out += step * times
    return out


def split_packs(packs: list[list[int]], lengths, parts: int) -> list[list[int]]:
    """Each pack cut into up to `parts` micro-batches of whole rows with about equal tokens, rows in order.

    After an out-of-memory error the trainer runs the same step again on smaller micro-batches: the step's rows,
    and so its token-weighted loss and gradient, stay the same.
    """
    if parts <= 1:
        return packs
    out = []
    for pack in packs:
        target = -(-sum(int(lengths[i]) for i in pack) // parts)  # ceil
        piece, tokens = [], 0
        for row in pack:
            if piece and tokens + int(lengths[row]) > target:
                out.append(piece)
                piece, tokens = [], 0
            piece.append(row)
            tokens += int(lengths[row])
        out.append(piece)
    return out


class StepRunner:
    """One optimizer step and evaluation; holds what every step needs."""

    PREFETCH_ON_CPU = False  # tests switch background collation on without a GPU

    def __init__(
        self,
        model,
        tokenizer,
        optimizer,
        scheduler,
        scaler,
        params,
        config: RunConfig,
        device: str,
        dtype,
        setup,
        world: distributed.World = distributed.SINGLE,
        sharded: bool = False,
        objective: Objective | None = None,
    ):
        self.world = world  # several processes: each runs its share of the packs; gradients summed over them
        # frozen weights split across the processes (hone.core.train.sharding): every process runs as many passes
        self.sharded = sharded
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.params, self.config, self.device, self.setup = params, config, device, setup
        # what a micro-batch's loss is (hone.core.train.objectives); the step around it is the same for every method
        self.objective = objective if objective is not None else SupervisedFineTuning(config)
        self.cuda = str(device).startswith("cuda")
        self.autocast_dtype = dtype if self.cuda and dtype != torch.float32 else None
        text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        self.pad_id = text_tokenizer.pad_token_id
        self.pin = self.cuda
        # On a GPU the next step's batches are collated on a background thread while this step computes (decoding
        # and resizing image rows is a noticeable share of a step: docs/performance/overview.md); on the CPU that
        # thread would only compete with the step for cores.
        self.prefetch = self.cuda or self.PREFETCH_ON_CPU
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, list[list[int]], Future] | None = None
        self.vision = None  # vision-language models: batches carry pixels next to the ids (hone.core.vision)
        if vision.is_vision_processor(tokenizer):
            self.vision = vision.collator_for(model, tokenizer, config, dtype)
            setup.note("vision", f"vision batches: {self.vision.describe()}")
        self.graphs = self._step_graphs()

    def _step_graphs(self):
        """The CUDA graphs the micro-batches replay (hone.core.speed.step_graphs), when the model and this run
        allow them; None otherwise, with the reason in the run's speed choices."""
        if not getattr(self.setup, "cuda_graphs", False) or self.vision is not None:
            return None
        from hone.core.speed.graph_choice import run_choice
        from hone.core.speed.step_graphs import StepGraphs

        sft = type(self.objective) is SupervisedFineTuning
        why = run_choice(
            method=self.config.train.method if sft else type(self.objective).__name__,
            processes=self.world.size,
            dropout=self.config.lora.dropout,
            optimizer=self.config.train.optimizer,
            takes_gradients=hasattr(self.optimizer, "clip_grad_norm_"),
        )
        if why is not None:
            self.setup.choices["cuda_graphs"] = f"off: {why}"
            return None
        return StepGraphs(
            self._graph_pass,
            self.params,
            self.device,
            note=lambda message, level="info": self.setup.note("cuda_graphs", message, level),
            settle=self._settle_collation,
        )

    def _settle_collation(self) -> None:
        """Wait for the background collation (before a CUDA graph is recorded); its errors surface where the
        batches are taken, as always."""
        if self._pending is not None:
            with contextlib.suppress(Exception):
                self._pending[2].result()

    def _graph_pass(self, batch, divisor: torch.Tensor) -> torch.Tensor:
        """Forward, loss and backward of one device batch, the loss sum scaled by `divisor` (a tensor, so a
        recorded pass reads each batch's own); returns the loss sum."""
        with self.autocast():
            summed = self.objective.loss_sum(self.model, batch)
        scaled = summed * divisor
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return summed

    def autocast(self):
        """The autocast context the steps run their forward in (none on the CPU or in float32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.autocast_dtype)

    def collate(self, rows):
        """One micro-batch on the host (pinned on a GPU), with its embedding rows when the table lives there. A row
        of several sequences (a preference pair) gives them in order, each a sequence of its own."""
        own = getattr(self.objective, "collate", None)  # a method whose batches are not token rows (GRPO's prompts)
        if own is not None:
            return own(rows)
        rows = [sequence for row in rows for sequence in getattr(row, "sequences", (row,))]
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

    def collate_rows(self, dataset: TokenizedSet, rows: list[int]):
        """One micro-batch of `rows` of `dataset`, with what the objective keeps per row of it (`annotate`: DPO's
        precomputed reference log-probabilities)."""
        batch = self.collate([dataset[i] for i in rows])
        annotate = getattr(self.objective, "annotate", None)
        return batch if annotate is None else annotate(batch, dataset, rows)

    def _collate_packs(self, dataset: TokenizedSet, packs: list[list[int]]) -> list:
        return [self.collate_rows(dataset, pack) for pack in packs]

    def eval_plan(self, dataset: TokenizedSet) -> list[list[int]]:
        """The packs `evaluate` takes `dataset`'s rows in (every process the same; each runs its share)."""
        return PackStream(dataset.lengths, self.config.train.batch_tokens, 0, self.config.speed.packing).plan(0)

    def reset_meters(self) -> None:
        """Drop what the speed paths' meters (expert load, offload) counted since the last step: a trial or a pass
        before step 1 is not the first step's."""
        for meter in (self.setup.expert_meter, self.setup.offload):
            if meter is not None:
                meter.read_and_reset()

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

    def forget_step(self) -> None:
        """Undo what a failed step left behind (an out-of-memory error mid-step): its gradients, the batches
        collated ahead for it, and the allocator's cached blocks. The weights and optimizer state are untouched: the
        optimizer only runs after every micro-batch's backward."""
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        self.objective.forget_step()  # the step's rows run again: their metrics are recorded again
        if self._pending is not None:
            self._pending[2].cancel()
            self._pending = None
        if self.cuda:
            torch.cuda.empty_cache()

    def trial_backward(self, rows) -> None:
        """Forward and backward of one micro-batch of `rows` with no optimizer step, leaving no trace: gradients,
        random state and the speed paths' counters are as before (the measured preflight runs it)."""
        devices = [torch.cuda.current_device()] if self.cuda else []
        try:
            with torch.random.fork_rng(devices=devices), reuse_weight_casts():
                if not self.model.training:
                    self.model.train()
                batch = self.collate(rows).to(self.device)
                with self.autocast():
                    summed = self.objective.loss_sum(self.model, batch)
                batch = None  # as in step(): the batch's device tensors must not stay allocated through backward
                summed.backward()  # the scale does not change what backward allocates
        finally:
            self.optimizer.zero_grad(set_to_none=self.graphs is None)
            self.objective.forget_step()  # a trial: the first step's metrics are the step's own
            self.reset_meters()

    def _begin_step(self, step: int) -> None:
        """Tell the objective which step runs, where its steps depend on it (GRPO's answers reused in a cycle)."""
        begin_step = getattr(self.objective, "begin_step", None)
        if begin_step is not None:
            begin_step(step)

    def close(self) -> None:
        """Stop the background collation thread and put the vocabulary tables back on the device (a run's end)."""
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.setup.host_tables is not None:
            self.setup.host_tables.restore(self.model)

    def step(
        self,
        dataset: TokenizedSet,
        packs: list[list[int]],
        step: int,
        total: int,
        next_packs: list[list[int]] | None = None,
        counts: tuple[int, int] | None = None,
    ) -> dict:
        """Run one optimizer step over `packs` (one micro-batch each); returns StepMetrics fields. `next_packs`,
        the packs of the step after, are collated in the background meanwhile (on a GPU). `counts`: the tokens and
        trained tokens of the whole step when several processes share it (`packs` is this process's share)."""
        model, cfg = self.model, self.config.train
        self._begin_step(step)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        batches = self._batches(dataset, packs, next_packs)
        data_wait = time.perf_counter() - started  # ~0 when the background collation kept up with the last step
        trained = sum(self.objective.units(b) for b in batches)  # known on the CPU: no sync to normalize the loss
        tokens = sum(b.num_tokens for b in batches)
        if counts is not None:
            tokens, trained = counts
        loss_total = torch.zeros((), device=self.device, dtype=torch.float32)
        if not model.training:  # model.train() visits every module: thousands of calls on each step otherwise
            model.train()
        weights = [1.0] * len(batches)
        if self.sharded:  # a process with fewer micro-batches runs its first again, with zero weight
            extra = distributed.most(len(batches), self.world) - len(batches)
            batches, weights = batches + batches[:1] * extra, weights + [0.0] * extra
        with reuse_weight_casts():  # the adapters change only at the optimizer step below
            for batch, weight in zip(batches, weights, strict=True):
                self._micro_batch(batch, weight, trained, loss_total)
        distributed.sum_gradients(self.params, self.optimizer, self.world)
        distributed.sum_tensor_(loss_total, self.world)
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
        # recorded backwards add into the gradients where they are: zeroed in place, never dropped
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        loss = loss_total.item() / max(trained, 1)  # the step's one deliberate sync, after all GPU work is queued
        if self.cuda:
            torch.cuda.synchronize()
        step_time = time.perf_counter() - started
        if self.setup.compile is not None and (compiling := self.setup.compile.take_new_seconds()):
            # compilation happens inside the first steps; report it once and keep it out of the step's rate
            step_time = max(step_time - compiling, 1e-6)
            self.setup.note("compile", f"compiled decoder blocks in {compiling:.1f} s (not counted in step times)")
        out = dict(
            loss=loss,
            lr=lr,
            grad_norm=float(grad_norm),
            tokens=tokens,
            trained_tokens=trained,
            tokens_per_s=tokens / step_time,
            step_time=step_time,
            data_wait_s=data_wait,
        )
        if self.cuda:
            peak = torch.cuda.max_memory_allocated()
            if self.graphs is not None:  # replays allocate nothing the allocator's peak would see
                peak = max(peak, self.graphs.take_replayed_peak())
            out.update(mem_allocated=peak, mem_reserved=torch.cuda.memory_reserved())
        if self.world.launched:
            out["mem_by_gpu"] = distributed.gather_counts(out.get("mem_allocated", 0), self.world)
        out.update(self.objective.step_metrics())
        if self.setup.expert_meter is not None:
            out["expert_load"] = self.setup.expert_meter.read_and_reset()
        if self.setup.offload is not None:
            out.update(self.setup.offload.read_and_reset())
        return out

    def _micro_batch(self, batch, weight: float, trained: int, loss_total: torch.Tensor) -> None:
        """Forward and backward of one host batch (replayed as a CUDA graph where one is recorded), its loss sum
        added into `loss_total` unless its `weight` is 0 (a sharded process's extra pass)."""
        if weight and self.graphs is not None and (summed := self.graphs.run(batch, trained)) is not None:
            loss_total += summed
            return
        batch = batch.to(self.device)
        with self.autocast():
            summed = self.objective.loss_sum(self.model, batch)
        # Backward needs none of the batch's device tensors (the graph keeps what it uses): the embedding rows a
        # host table supplies (T x H) must not stay allocated through it.
        batch = None
        scaled = summed / max(trained, 1) if weight else summed * 0.0
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        if weight:
            loss_total += summed.detach()

    @torch.no_grad()
    def evaluate(self, dataset: TokenizedSet) -> float:
        """Mean loss over the evaluation rows (per trained token, for SFT)."""
        model = self.model
        model.eval()
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        trained = 0
        plan = self.eval_plan(dataset)
        mine = self.world.share(plan)  # each process its share of the rows
        passes = distributed.most(len(mine), self.world) if self.sharded else len(mine)
        with reuse_weight_casts():
            for i in range(passes):  # past its own packs, a sharded process runs the first one, uncounted
                batch = self.collate_rows(dataset, mine[i] if i < len(mine) else plan[0])
                with self.autocast():
                    summed = self.objective.loss_sum(model, batch.to(self.device), evaluating=True).float()
                if i < len(mine):
                    trained += self.objective.units(batch)
                    total += summed
        model.train()
        total_sum, trained = distributed.sum_values([total.item(), trained], self.world)
        return total_sum / max(trained, 1)

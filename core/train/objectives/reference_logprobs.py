"""The reference model's log-probabilities, computed once before step 1 instead of at every step.

DPO's and KTO's losses compare the fine-tune with the base model: the same weights with the adapter off. Those
weights never change, so each answer's reference log-probability is a fixed number of the run's data. With
`preference.precompute_reference` on, `PrecomputedReference.prepare` runs one gradient-free pass of the adapter-off
model over the rows the run will still train on (and every evaluation row) before step 1, with the steps' own
collation, speed paths, autocast and model mode (train for training rows, eval for evaluation rows, as the steps and
`StepRunner.evaluate` run them), and keeps one float32 value per stored sequence of the tokenized data. Each
micro-batch then carries its sequences' values (`annotate`: `batch.reference`) and the loss reads them instead of
running the adapter-off forward: one forward less per micro-batch.

The pass groups the training rows as the stream's first epoch packs them, so in the first epoch each value is the one
the step would have computed, bit for bit (the same micro-batch through the same kernels); later epochs group rows
differently, which moves a value by float rounding at most (as an on-the-fly forward of another grouping would).
Only rows the run will still train on are computed: a run of a few steps on a large set computes what those steps
need, so the pass runs no more forwards than the steps would have (a run stopped early aside).

Cache: the values go into the data cache (`cache_root("datasets")/reference/<key>`), keyed by what decides them: the
model (its Hub commit, or a fingerprint of its weight files), the tokens (`tokens_fingerprint`), the weights' dtype,
the quantization, the [speed] settings, the device and the library versions. An entry records which sequences it
holds; a later run or a resume reads the values it needs and computes only those missing, never replacing one it
read, so a resumed run goes on with the values the run before it used. An entry that fails its checks (a sha256 per
array) is computed again.

Several processes: each computes its share of the packs (every N-th, as steps are dealt out) and the values are
gathered on every process; process 0 writes the cache. With frozen weights split across the processes (fsdp) every
process runs as many passes (a short one repeats a pack, uncounted). A stop asked for during the pass ends it between
micro-batches; nothing is kept and the steps compute the reference themselves.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import peft
import torch
import transformers

from hone.core.data import cache as data_cache
from hone.core.data.collate import PackedBatch, PaddedBatch
from hone.core.errors import HoneError
from hone.core.events import Notice
from hone.core.models.load import resolve_source
from hone.core.train import distributed
from hone.core.train.objectives.base import ObjectiveSetup
from hone.core.train.provenance import model_revision
from hone.kernels.weight_casts import reuse_weight_casts

FORMAT = 1  # bumped when what an entry holds changes meaning, so older entries are not read
CACHE_FOLDER = "reference"  # under the data cache
# A progress Notice at most this often while the pass runs: a large set takes minutes, and a line every few seconds
# would flood the run's log.
PROGRESS_EVERY_S = 30.0
TOPIC = "reference"


@dataclass
class PackedWithReference(PackedBatch):
    """A PackedBatch with each sequence's reference log-probability: `reference`, (S,) fp32 in the batch's order."""

    reference: torch.Tensor | None = None


@dataclass
class PaddedWithReference(PaddedBatch):
    """A PaddedBatch with each row's reference log-probability: `reference`, (B,) fp32 in the batch's order."""

    reference: torch.Tensor | None = None


_WITH_REFERENCE: dict[type, type] = {PackedBatch: PackedWithReference, PaddedBatch: PaddedWithReference}


def with_reference(batch, values: torch.Tensor):
    """`batch` carrying `values` ((S,) fp32, one per sequence) as `reference`; another kind of batch (vision) as it
    is, so its loss computes the reference itself."""
    kind = _WITH_REFERENCE.get(type(batch))
    if kind is None:
        return batch
    return kind(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}, reference=values)


class _Sequences:
    """Where the sequences of a data set's rows are stored: a pair set's row k is its sequences 2k and 2k + 1 (chosen,
    rejected: the order the collation gives them), an unpaired (KTO) row its one sequence."""

    def __init__(self, dataset):
        self.per_row = len(dataset.sequences) // max(len(dataset), 1)
        self.stored = np.asarray(dataset.sequences.arrays()["rows"], dtype=np.int64)  # shown sequence -> stored one

    def of(self, rows) -> np.ndarray:
        """int64 [len(rows) * per_row]: the stored sequences of `rows`, in the order a micro-batch of them holds."""
        rows = np.asarray(rows, dtype=np.int64)
        return self.stored[(rows[:, None] * self.per_row + np.arange(self.per_row)).reshape(-1)]


@dataclass
class _Table:
    """One reference value per stored sequence of a tokenized set, and which of them are known.

    Attributes:
        key: the data-cache key ("" when the model cannot be identified: the table is not cached).
        values: float32 [stored sequences]; NaN where not known.
        known: bool [stored sequences].
        read: how many values came from the cache.
    """

    key: str
    values: np.ndarray
    known: np.ndarray
    read: int = 0

    @classmethod
    def empty(cls, key: str, size: int) -> _Table:
        return cls(key, np.full(size, np.nan, dtype=np.float32), np.zeros(size, dtype=bool))


@dataclass
class _Job:
    """Rows of one data set to compute, in packs, and the model mode their steps run in."""

    dataset: Any
    sequences: _Sequences
    table: _Table
    packs: list[list[int]]
    training: bool


class PrecomputedReference:
    """A run's reference log-probabilities (`prepare`), put on each micro-batch that has them (`annotate`).

    Args:
        score: (model, batch) -> (S,) fp32 tensor: each sequence's summed answer log-probability under the reference
            (the adapter off), without gradients.
        unit: what a row of the data is, for the notices ("pairs", "rows").
    """

    def __init__(self, score: Callable[[Any, Any], torch.Tensor], unit: str):
        self.score = score
        self.unit = unit
        self._sets: list[tuple[Any, _Sequences, _Table]] = []  # (data set, its sequences, their values)

    def annotate(self, batch, dataset, rows: list[int]):
        """`batch` (collated from `rows` of `dataset`) with its sequences' reference values, when all are known."""
        for known_set, sequences, table in self._sets:
            if known_set is dataset:
                stored = sequences.of(rows)
                if table.known[stored].all():
                    return with_reference(batch, torch.from_numpy(table.values[stored]))
        return batch

    def prepare(self, setup: ObjectiveSetup) -> Iterator[Notice]:
        """Read the values the run needs from the data cache and compute those missing (see the module's
        docstring); yields the pass's notices."""
        if getattr(setup.steps, "vision", None) is not None:  # vision batches carry no values: the steps compute them
            return
        jobs = self._jobs(setup)
        tables = list({id(job.table): job.table for job in jobs}.values())
        rows = sum(len(pack) for job in jobs for pack in job.packs)
        read = sum(table.read for table in tables)
        if rows == 0:
            self._sets = [(job.dataset, job.sequences, job.table) for job in jobs]
            if read:
                yield Notice(
                    topic=TOPIC,
                    message=(
                        f"the base model's log-probabilities of the run's {self.unit} were read from the data cache: "
                        "the steps run without a reference forward"
                    ),
                )
            return
        started = time.monotonic()
        cached = f"; {read:,} answers' values came from the data cache" if read else ""
        yield Notice(
            topic=TOPIC,
            message=(
                f"computing the base model's log-probabilities of {rows:,} {self.unit} once, before step 1, so the "
                f"steps run without a reference forward (preference.precompute_reference){cached}"
            ),
        )
        computed = yield from self._compute(setup, jobs, rows)
        if computed is None:
            yield Notice(
                topic=TOPIC,
                level="warning",
                message="stopped while computing the base model's log-probabilities; nothing was kept",
            )
            return
        for table, stored, values in computed:
            table.values[stored] = values
            table.known[stored] = True
        self._sets = [(job.dataset, job.sequences, job.table) for job in jobs]
        if not all(table.key for table in tables):
            kept = self._why_uncached(setup)
        else:
            kept = self._save(tables) if setup.world.main else ""
        yield Notice(
            topic=TOPIC,
            message=(
                f"computed the base model's log-probabilities of {rows:,} {self.unit} in "
                f"{time.monotonic() - started:.1f} s; " + (kept or "kept in the data cache for later runs and resumes")
            ),
        )

    # ---- which rows ----
    def _jobs(self, setup: ObjectiveSetup) -> list[_Job]:
        """The training rows the remaining steps take and every evaluation row, as packs of those still unknown."""
        data, keys = setup.data, _KeyMaker(setup)
        tables: dict[int, _Table] = {}  # by the stored tokens (a held-out evaluation set shares the training set's)
        jobs = []
        sets = [(data.train, True)] + ([(data.eval, False)] if data.eval is not None else [])
        for dataset, training in sets:
            arrays = dataset.sequences.arrays()
            if id(arrays["ids"]) not in tables:
                stored = len(arrays["offsets"]) - 1
                tables[id(arrays["ids"])] = self._read(keys.key(dataset.sequences), stored, setup.world)
            table = tables[id(arrays["ids"])]
            sequences = _Sequences(dataset)
            if training:
                needed = _rows_trained(setup.stream, setup.positions, len(dataset))
                plan = setup.stream.plan(0)
            else:
                needed = np.ones(len(dataset), dtype=bool)
                plan = setup.steps.eval_plan(dataset)
            known = table.known[sequences.of(np.arange(len(dataset)))].reshape(len(dataset), -1).all(axis=1)
            missing = needed & ~known
            packs = [kept for pack in plan if (kept := [r for r in pack if missing[r]])]
            jobs.append(_Job(dataset, sequences, table, packs, training))
        return jobs

    # ---- the cache ----
    @staticmethod
    def _read(key: str, stored: int, world) -> _Table:
        """The table under `key` in the data cache (process 0 reads it, every process gets it), else an empty one."""
        table = None
        if key and world.main:
            arrays = data_cache.load_checked_arrays(
                _folder(key), {"values": (np.float32, (stored,)), "known": (np.bool_, (stored,))}
            )
            if arrays and not np.isnan(arrays["values"][arrays["known"]]).any():
                table = _Table(key, arrays["values"].copy(), arrays["known"].copy(), int(arrays["known"].sum()))
        table = distributed.from_main(table, world)
        return table if table is not None else _Table.empty(key, stored)

    @staticmethod
    def _save(tables) -> str:
        """Write every table into the data cache; "" when all were written, else what went wrong."""
        for table in tables:
            about = {"what": "reference log-probabilities per stored sequence", "format": FORMAT}
            try:
                data_cache.save_checked_arrays(
                    _folder(table.key), {"values": table.values, "known": table.known}, about
                )
            except OSError as e:
                return f"not kept: the data cache could not be written ({e.strerror or e}); later runs compute them"
        return ""

    @staticmethod
    def _why_uncached(setup: ObjectiveSetup) -> str:
        _, why = _model_identity(setup.config.model)
        return f"not kept: the model's weights could not be identified ({why})"

    # ---- the pass ----
    def _compute(
        self, setup: ObjectiveSetup, jobs: list[_Job], rows: int
    ) -> Generator[Notice, None, list[tuple[_Table, np.ndarray, np.ndarray]] | None]:
        """Every job's packs through `score`, this process taking its share; returns [(table, stored sequences,
        values)] gathered from every process, or None when a stop ended the pass. Yields progress notices."""
        steps, world, model = setup.steps, setup.world, setup.model
        mine_total = sum(len(pack) for job in jobs for pack in world.share(job.packs))
        done, last = 0, time.monotonic()
        found: list[tuple[int, np.ndarray, torch.Tensor]] = []  # (job, stored sequences, values on the device)
        for index, job in enumerate(jobs):
            if not job.packs:
                continue
            mine = world.share(job.packs)
            # every process runs as many passes: the stop is agreed on at each, and fsdp gathers weights in each
            passes = distributed.most(len(mine), world) if world.launched else len(mine)
            for i in range(passes):
                if distributed.any_process(setup.stop_requested(), world):
                    model.train()
                    return None
                pack = mine[i] if i < len(mine) else job.packs[0]  # past its own, a process repeats one, uncounted
                values = self._score_pack(setup, job, pack)
                if i < len(mine):
                    found.append((index, job.sequences.of(pack), values))
                    done += len(pack)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    share = done / max(mine_total, 1)
                    yield Notice(
                        topic=TOPIC,
                        message=f"the base model's log-probabilities: {share:.0%} of {rows:,} {self.unit} done",
                    )
        model.train()
        steps.reset_meters()  # the pass's tokens are not the first step's (expert load, offload)
        local = [(index, stored, values.cpu().numpy()) for index, stored, values in found]
        out = []
        for part in distributed.gather(local, world):
            out += [(jobs[index].table, stored, values) for index, stored, values in part]
        return out

    def _score_pack(self, setup: ObjectiveSetup, job: _Job, pack: list[int]) -> torch.Tensor:
        """(S,) fp32 reference values of one micro-batch of `pack`'s rows, as the steps (or evaluation) run it; the
        random state is left as it was, so the steps draw what they would have without the pass."""
        steps, model = setup.steps, setup.model
        if model.training != job.training:
            model.train(job.training)
        devices = [torch.cuda.current_device()] if str(steps.device).startswith("cuda") else []
        batch = steps.collate([job.dataset[r] for r in pack]).to(steps.device)
        with torch.random.fork_rng(devices=devices), torch.no_grad(), reuse_weight_casts(), steps.autocast():
            return self.score(model, batch).float()


def _rows_trained(stream, positions: range, rows: int) -> np.ndarray:
    """bool [rows]: the rows the packs at `positions` of the stream hold."""
    needed = np.zeros(rows, dtype=bool)
    count = 0
    for position in positions:
        pack = stream.take(position)
        count += int((~needed[pack]).sum())
        needed[pack] = True
        if count == rows:  # every row is in: later epochs add none
            break
    return needed


def _folder(key: str) -> Path:
    return data_cache.default_cache_dir() / CACHE_FOLDER / key


def _model_identity(model) -> tuple[dict[str, Any] | None, str]:
    """What identifies the base model's weights (a ModelConfig): its Hub commit or a fingerprint of its weight
    files (names, sizes, modification times), or None and why not."""
    try:
        source = resolve_source(model.name_or_path, model.gguf_file)
    except HoneError as e:
        return None, e.message
    where = model.name_or_path if source.kind == "hub" else source.path
    facts, why = model_revision(where, model.revision, "")
    if facts.get("revision") is None and facts.get("fingerprint") is None:
        return None, why or "no revision or weight files found"
    return {"name": model.name_or_path, "gguf_file": model.gguf_file, **facts}, ""


class _KeyMaker:
    """The data-cache key of a tokenized set's reference values in this run (see the module's docstring)."""

    def __init__(self, setup: ObjectiveSetup):
        config = setup.config
        device = torch.device(setup.steps.device)
        identity, _ = _model_identity(config.model)
        self.parts = None
        if identity is not None:
            self.parts = {
                "what": "reference log-probabilities",
                "format": FORMAT,
                "model": identity,
                "dtype": str(setup.dtype),
                "qlora": config.lora.qlora,
                "speed": dataclasses.asdict(config.speed),
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
                "versions": [torch.__version__, transformers.__version__, peft.__version__],
            }
        self._fingerprints: dict[int, str] = {}  # tokens fingerprint by its ids array (train and held-out share one)

    def key(self, sequences) -> str:
        """The key of `sequences`' values (a TokenizedSet), or "" when the model cannot be identified (nothing is
        cached then)."""
        if self.parts is None:
            return ""
        ids = sequences.arrays()["ids"]
        if id(ids) not in self._fingerprints:
            self._fingerprints[id(ids)] = data_cache.tokens_fingerprint(sequences)
        return data_cache.cache_key({**self.parts, "tokens": self._fingerprints[id(ids)]})

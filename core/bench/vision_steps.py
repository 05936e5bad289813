"""What one vision benchmark run's steps gave (`RunSteps`), and the padded batches that plain transformers + peft
and the Unsloth peer train on (`padded_batches`, `padded_steps`): the rows Hone's Trainer reads, in the batches its
planner makes, padded. Needs a CUDA GPU to run steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

IMAGE_SIDE = 448  # pixels: (448 / 14)^2 / 4 = 256 image tokens (Qwen2.5-VL)


@dataclass
class RunSteps:
    """What one run's steps gave, warm-up included: seconds, real (non-padding) tokens and loss of each step."""

    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    data_wait: list[float] = field(default_factory=list)  # seconds (Hone's Trainer: background collation fell behind)
    peak_allocated: int = 0  # bytes, over the timed steps
    peak_reserved: int = 0
    first_grad_norm: float | None = None
    trainable_params: int | None = None
    speed_paths: dict = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    profile: dict | None = None  # one extra step under torch.profiler (`--profile`), not among the steps above


@dataclass
class PaddedBatches:
    """The batches a plain script trains on: Hone's planner's batches of rows, padded, with labels shifted the way
    transformers' own loss expects (the label at t + 1 is what position t predicts)."""

    collator: object
    rows: object
    plan: list[list[int]]

    def batch(self, step: int):
        batch = self.collator.collate([self.rows[i] for i in self.plan[step % len(self.plan)]]).to("cuda")
        labels = torch.where(torch.roll(batch.text.targets, 1, dims=1) != -100, batch.text.input_ids, -100)
        return batch, dict(batch.model_inputs(), labels=labels)


def padded_batches(model_dir: Path, data: Path, family: str, model_config, *, batch_tokens: int) -> PaddedBatches:
    """The same rows as Hone's Trainer reads, in the batches its planner makes, for a padded run."""
    from hone.core.config import DataConfig
    from hone.core.data import load_training_data, plan_packs
    from hone.core.models.load import load_tokenizer
    from hone.core.vision import family_for
    from hone.core.vision.collate import VisionCollator

    processor = load_tokenizer(str(model_dir), model_config)
    cfg = DataConfig(train=[str(data)], max_length=batch_tokens, image_max_side=IMAGE_SIDE)
    rows = load_training_data(cfg, processor, cache_dir=data.parent / "cache").train
    collator = VisionCollator(
        family_for(family),
        processor,
        model_config,
        image_max_side=IMAGE_SIDE,
        packing=False,
        pad_id=processor.tokenizer.pad_token_id,
        dtype=torch.bfloat16,
    )
    return PaddedBatches(collator, rows, plan_packs(rows.lengths, batch_tokens, seed=0, epoch=0))


def padded_steps(model, batches: PaddedBatches, out: RunSteps, *, steps: int, warmup: int) -> RunSteps:
    """Train `model` (LoRA already on it) for `steps` steps of `batches` with the model's own loss, clipping at 1.0
    and fused AdamW (as Hone's Trainer and transformers' Trainer do by default); fills `out` with each step's time,
    real tokens and loss, and the peak memory over the steps after `warmup`."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        batch, inputs = batches.batch(step)
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.times.append(time.perf_counter() - start)
        out.tokens.append(batch.num_tokens)
        out.losses.append(loss.item())
        if step == warmup - 1:
            torch.cuda.reset_peak_memory_stats()
    out.peak_allocated = torch.cuda.max_memory_allocated()
    out.peak_reserved = torch.cuda.max_memory_reserved()
    return out

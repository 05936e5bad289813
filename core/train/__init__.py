"""Training: the loop, one optimizer step, the loss, the optimizer, LoRA, and what a run writes to disk.

    trainer.py      Trainer: config -> data -> model -> speed paths -> LoRA -> steps -> events
    step.py         StepRunner: one optimizer step and evaluation; PackStream: packs in training order
    loss.py         the token-summed cross-entropy, chunked over the LM head
    optim.py        AdamW variants and the learning-rate schedule
    lora.py         LoRA adapters through peft, and the trainable-parameter report
    checkpoints.py  resumable checkpoints, written atomically
    resume_checks.py  what a checkpoint records (config, data hashes), and what a resume may change
    provenance.py   what a run was made from (model revision, library versions, GPU, seed), and a rerun's check
    run_dir.py      the run folder: config, metrics, log, status summary
    metrics_series.py  a run's metrics.jsonl as chart columns, read fast; thinning a series for drawing
    json_checks.py  a run folder's small JSON files (run.json, a checkpoint's state.json) read as possibly damaged
    run_lock.py     one process at a time in a run folder (an OS lock, with who holds it)
    adapter_dir.py  the final adapter folder with tokenizer and model card

Importing this package is light: `Trainer` and `StepRunner` load torch when first used.
"""

from __future__ import annotations

import importlib

_LAZY = {"Trainer": "hone.core.train.trainer", "StepRunner": "hone.core.train.step"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Training: the loop, one optimizer step, the loss, the optimizer, LoRA, and what a run writes to disk.

    trainer.py      Trainer: config -> data -> model -> speed paths -> LoRA -> steps -> events
    prepare.py      what the Trainer does before step 1: the run settled once, as a PreparedRun
    step.py         StepRunner: one optimizer step and evaluation; PackStream: packs in training order
    loss.py         the token-summed cross-entropy, chunked over the LM head
    optim.py        AdamW variants and the learning-rate schedule
    lora.py         LoRA adapters through peft, and the trainable-parameter report
    checkpoints.py  resumable checkpoints, written atomically
    resume_checks.py  what a checkpoint records (config, data hashes), and what a resume may change
    resume_rules.py   each setting's rule on resume (ON_RESUME), and the settings two configs differ in
    data_hashes.py    the data files' sizes and sha256, and what decides the pack order
    resume_schedule.py  a resumed run's length, data position, schedule and optimizer settings
    run_facts.py    RunFacts: what the trainer records in each checkpoint, and a resume once it is loaded
    provenance.py   what a run was made from (model revision, library versions, GPU, seed), and a rerun's check
    run_dir.py      the run folder: config, metrics, log, status summary (RunWriter)
    run_layout.py   what a run folder holds, by name, and making a new one
    run_log.py      train.log's lines, one per event
    safe_writes.py  atomic JSON, append-only line files, the disk-full error
    run_history.py  a run folder read back: run.json checked, its events, the list of runs
    run_compare.py  runs side by side: the settings that differ, their numbers, their chart series (hone compare)
    sample_answers.py  train.sample_prompts answered at each evaluation, training left bit-exact
    samples_file.py    samples.jsonl: those answers, one line per evaluation, written safely and read bounded
    method_columns.py  metrics.jsonl as chart columns with the training methods' own (the Monitor's reader)
    json_floats.py  JSON numbers parsed a whole column at a time, as float() reads them
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

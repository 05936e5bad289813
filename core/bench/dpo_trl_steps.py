"""TRL's DPOTrainer timed step by step, the baseline of `hone bench dpo-…` (and, on Unsloth's model, its peer): the
generated pairs in padded batches, peft's LoRA on every linear layer, the reference as the adapter disabled."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from hone.core.bench.vision_steps import RunSteps
from hone.core.models.hub_kernels import from_pretrained_options

BETA = 0.1
LR = 1e-4


def trl_steps(
    model_dir: Path,
    pairs: list[dict],
    out_dir: Path,
    *,
    steps: int,
    warmup: int,
    pairs_per_step: int,
    max_length: int,
    lora_r: int,
    device: str,
    adapted=None,
    speed_paths: dict | None = None,
) -> RunSteps:
    """TRL's DPOTrainer with a peft LoraConfig (its documented LoRA setup), `steps` optimizer steps of
    `pairs_per_step` pairs; each step timed from its start to the end of its optimizer step, the GPU synchronized.

    `adapted`: a model already loaded with its LoRA and its own gradient checkpointing (the Unsloth peer's), trained
    as given: no peft config and no checkpointing of TRL's; `speed_paths` then says what it runs with."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from hone.core.bench.trl_setup import common_args, lora_config

    cuda = torch.device(device).type == "cuda"
    out = RunSteps(
        speed_paths=speed_paths
        or {
            "batch": "padded pairs",
            "attention": "transformers' default",
            "checkpoint": "transformers' gradient checkpointing" if cuda else "off",
            "reference": "the adapter disabled (peft)",
        }
    )
    tokens: list[int] = []

    class Timed(DPOTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            tokens.append(int(inputs["attention_mask"].sum()))
            return super().training_step(model, inputs, num_items_in_batch)

    class Clock(TrainerCallback):
        began = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            out.times.append(time.perf_counter() - self.began)
            if cuda and len(out.times) > warmup:
                out.peak_allocated = max(out.peak_allocated, torch.cuda.max_memory_allocated())
                out.peak_reserved = max(out.peak_reserved, torch.cuda.max_memory_reserved())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                out.losses.append(float(logs["loss"]))
                if out.first_grad_norm is None and logs.get("grad_norm") is not None:
                    out.first_grad_norm = float(logs["grad_norm"])

    dtype = torch.bfloat16 if cuda else torch.float32
    if adapted is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **from_pretrained_options()).to(device)
    else:
        model = adapted
    args = DPOConfig(
        **common_args(out_dir, steps=steps, lr=LR, cuda=cuda, checkpointing=cuda and adapted is None),
        per_device_train_batch_size=pairs_per_step,
        beta=BETA,
        max_length=max_length,
    )
    trainer = Timed(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(pairs),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=lora_config(lora_r) if adapted is None else None,
        callbacks=[Clock()],
    )
    out.trainable_params = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    out.tokens = tokens[: len(out.times)]
    del trainer, model
    return out

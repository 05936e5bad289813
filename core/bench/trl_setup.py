"""What Hone's benchmarks against TRL's trainers give every TRL run alike: the trainer arguments of one process that
trains `steps` optimizer steps at a constant learning rate, logs each step and saves nothing, with gradient
checkpointing and bf16 on a GPU (as TRL's documentation sets it up with peft), and peft's LoRA on every linear
layer with the rank Hone's run has."""

from __future__ import annotations

from pathlib import Path


def common_args(out_dir: Path, *, steps: int, lr: float, cuda: bool, checkpointing: bool | None = None) -> dict:
    """Keyword arguments of TRL's DPOConfig / GRPOConfig that every benchmark run shares; `checkpointing` False for a
    model that brings its own gradient checkpointing (None: on a GPU)."""
    checkpointing = cuda if checkpointing is None else checkpointing
    return dict(
        output_dir=str(out_dir),
        report_to=[],
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        gradient_checkpointing=checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )


def lora_config(rank: int):
    """peft's LoRA on every linear layer, alpha 2 × rank, no dropout: the trainable parameters Hone's run has."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")

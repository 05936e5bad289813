"""Unsloth's vision path as a peer of `hone bench vision-... --peer unsloth`, in a child process because importing
unsloth patches transformers globally (`python -m hone.core.bench.peer_unsloth_vision SPEC.json RESULT.json`).

The child loads the benchmark's saved model with `FastVisionModel.from_pretrained`, puts LoRA on the language
model's attention and MLP layers only (`finetune_vision_layers=False`, as the reference does), with Unsloth's own
gradient checkpointing, and trains the reference's padded batches (text-only rows included: Unsloth's vision collator
takes them too) through `vision_steps.padded_steps`. Unsloth needs a CUDA GPU: no CPU test covers the child itself.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from hone.core.bench.peer_process import PeerFailed, answer_child, run_child
from hone.core.bench.peer_unsloth import unsloth_available

__all__ = ["PeerFailed", "unsloth_vision_steps"]


def _train(spec: dict) -> dict:
    """In the child: load, adapt and train the model with Unsloth; its RunSteps as a dict."""
    import torch
    import unsloth  # before anything imports transformers, so it can patch it
    from unsloth import FastVisionModel

    from hone.core.bench.vision_steps import RunSteps, padded_batches, padded_steps

    model, _processor = FastVisionModel.from_pretrained(
        spec["model_dir"],
        dtype=torch.bfloat16,
        load_in_4bit=False,
        max_seq_length=spec["batch_tokens"],
        use_gradient_checkpointing="unsloth",
    )
    model = FastVisionModel.get_peft_model(
        model,
        finetune_vision_layers=False,
        finetune_language_layers=True,
        finetune_attention_modules=True,
        finetune_mlp_modules=True,
        r=spec["lora_r"],
        lora_alpha=2 * spec["lora_r"],
        lora_dropout=0,
        bias="none",
        random_state=spec["seed"],
        use_gradient_checkpointing="unsloth",
    )
    FastVisionModel.for_training(model)
    batches = padded_batches(
        Path(spec["model_dir"]), Path(spec["data"]), spec["family"], model.config, batch_tokens=spec["batch_tokens"]
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out = RunSteps(
        speed_paths={
            "peer": f"unsloth {getattr(unsloth, '__version__', '?')}, FastVisionModel with its defaults",
            "batch": "padded",
            "lora": f"{trainable:,} trainable (language model only)",
        }
    )
    return dataclasses.asdict(padded_steps(model, batches, out, steps=spec["steps"], warmup=spec["warmup"]))


def unsloth_vision_steps(
    model_dir: Path, data: Path, family: str, *, steps: int, warmup: int, batch_tokens: int, lora_r: int, seed: int = 0
):
    """Run the peer in a child process and return its RunSteps.

    Raises:
        PeerFailed: unsloth is not installed, the child crashed or ran too long, or the run inside it failed.
    """
    from hone.core.bench.vision_steps import RunSteps

    if not unsloth_available():
        raise PeerFailed("unsloth is not installed")
    spec = {
        "model_dir": str(model_dir),
        "data": str(data),
        "family": family,
        "steps": steps,
        "warmup": warmup,
        "batch_tokens": batch_tokens,
        "lora_r": lora_r,
        "seed": seed,
    }
    answer = run_child(__name__, spec, who="Unsloth")
    known = {f.name for f in dataclasses.fields(RunSteps)}
    return RunSteps(**{k: v for k, v in answer.items() if k in known})


if __name__ == "__main__":
    raise SystemExit(answer_child(sys.argv[1:], _train))

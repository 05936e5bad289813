"""Unsloth's preference and GRPO training as the peer of `hone bench dpo-… / grpo-… --peer unsloth`, in a child
process (`python -m hone.core.bench.peer_unsloth_trl SPEC.json RESULT.json`).

Importing unsloth rewrites TRL's trainers into its own (its DPO and GRPO patches). The child loads the benchmark's
saved model with `FastLanguageModel` (its kernels), puts LoRA on every linear layer of the decoder at the benchmark's
rank (alpha 2r, no dropout, its own gradient checkpointing), and hands that model to the same TRL run as the
baseline's (`dpo_trl_steps.trl_steps`, `grpo_steps.trl_grpo_steps`), which then adds no adapter and no checkpointing of
its own. Same data, batch sizes, learning rate, β and loss as the TRL run: only Unsloth differs. Unsloth needs a CUDA
GPU; a CPU test runs the child with a stand-in package of the same names.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from hone.core.bench.peer_process import PeerFailed, answer_child, run_child
from hone.core.bench.peer_unsloth import PEER_NAME, unsloth_available


def _adapted_model(spec: dict):
    """The saved model through Unsloth's loader and its LoRA, as its documentation sets up a preference or RL run."""
    import torch
    from unsloth import FastLanguageModel

    from hone.core.bench.weights import decoder_linear_names

    cuda = torch.cuda.is_available()
    model, _tokenizer = FastLanguageModel.from_pretrained(
        model_name=spec["model_dir"],
        max_seq_length=spec["max_seq_length"],
        dtype=torch.bfloat16 if cuda else torch.float32,
        load_in_4bit=False,
    )
    return FastLanguageModel.get_peft_model(
        model,
        r=spec["lora_r"],
        lora_alpha=2 * spec["lora_r"],
        lora_dropout=0,
        bias="none",
        target_modules=decoder_linear_names(model),
        use_gradient_checkpointing="unsloth",
        random_state=spec["seed"],
    )


def _train(spec: dict) -> dict:
    """In the child: the TRL run of `spec["trainer"]` on Unsloth's model, its steps as a dict."""
    import unsloth  # first, so it patches transformers and TRL before they load

    version = getattr(unsloth, "__version__", "?")
    model = _adapted_model(spec)
    model_dir, out_dir = Path(spec["model_dir"]), Path(spec["out_dir"])
    if spec["trainer"] == "dpo":
        from hone.core.bench.dpo_trl_steps import trl_steps

        steps = trl_steps(
            model_dir,
            spec["pairs"],
            out_dir,
            adapted=model,
            speed_paths={
                "peer": f"unsloth {version}, its patched DPOTrainer and FastLanguageModel",
                "batch": "padded pairs",
                "checkpoint": "Unsloth's (use_gradient_checkpointing='unsloth')",
                "reference": "the adapter disabled",
            },
            **spec["sizes"],
        )
    elif spec["trainer"] == "grpo":
        from hone.core.bench.grpo_steps import trl_grpo_steps

        steps = trl_grpo_steps(
            model_dir,
            spec["rows"],
            out_dir,
            adapted=model,
            name=PEER_NAME,
            description=f"Unsloth {version}: its patched GRPOTrainer and FastLanguageModel, no vLLM, its own "
            "gradient checkpointing",
            **spec["sizes"],
        )
    else:
        raise ValueError(f"no Unsloth peer for the trainer {spec['trainer']!r}")
    return dataclasses.asdict(steps)


def _run(trainer: str, model_dir: Path, out_dir: Path, data: dict, sizes: dict, max_seq_length: int, lora_r: int):
    if not unsloth_available():
        raise PeerFailed("unsloth is not installed")
    spec = {
        "trainer": trainer,
        "model_dir": str(model_dir),
        "out_dir": str(out_dir),
        "max_seq_length": max_seq_length,
        "lora_r": lora_r,
        "seed": 0,
        "sizes": {**sizes, "lora_r": lora_r},
        **data,
    }
    return run_child(__name__, spec, who="Unsloth")


def unsloth_dpo_steps(model_dir: Path, pairs: list[dict], out_dir: Path, *, lora_r: int, max_length: int, **sizes):
    """Unsloth's DPO on the TRL run's pairs and sizes (`dpo_trl_steps.trl_steps`'s keywords), in a child process.

    Raises:
        PeerFailed: unsloth is not installed, the child crashed or ran too long, or the run inside it failed.
    """
    from hone.core.bench.vision_steps import RunSteps

    answer = _run(
        "dpo", model_dir, out_dir, {"pairs": pairs}, {**sizes, "max_length": max_length}, 2 * max_length, lora_r
    )
    known = {f.name for f in dataclasses.fields(RunSteps)}
    return RunSteps(**{k: v for k, v in answer.items() if k in known})


def unsloth_grpo_steps(model_dir: Path, rows: list[dict], out_dir: Path, *, lora_r: int, max_seq_length: int, **sizes):
    """Unsloth's GRPO on the TRL run's prompts and sizes (`grpo_steps.trl_grpo_steps`'s keywords), in a child
    process.

    Raises:
        PeerFailed: as `unsloth_dpo_steps`.
    """
    from hone.core.bench.grpo_steps import StepRun

    answer = _run("grpo", model_dir, out_dir, {"rows": rows}, sizes, max_seq_length, lora_r)
    known = {f.name for f in dataclasses.fields(StepRun)}
    return StepRun(**{k: v for k, v in answer.items() if k in known})


if __name__ == "__main__":
    raise SystemExit(answer_child(sys.argv[1:], _train))

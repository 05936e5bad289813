"""Unsloth's vision path as a peer of `hone bench vision-... --peer unsloth`, in a child process because importing
unsloth patches transformers globally (`python -m hone.core.bench.peer_unsloth_vision SPEC.json RESULT.json`).

The child loads the benchmark's saved model with `FastVisionModel.from_pretrained`, puts LoRA on the language
model's attention and MLP layers only (`finetune_vision_layers=False`, as the reference does), with Unsloth's own
gradient checkpointing, and trains the reference's padded batches (text-only rows included: Unsloth's vision collator
takes them too) through `vision_steps.padded_steps`. Unsloth needs a CUDA GPU: no CPU test covers the child itself.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hone.core.bench.peer_unsloth import PEER_NAME, unsloth_available

_TIMEOUT_S = 1800  # loading, patching and training the model in the child


class PeerFailed(RuntimeError):
    """The peer process could not run or measure its steps; the message says why."""


def child_main(spec_path: str, result_path: str) -> int:
    """Entry point of the child process: the peer's RunSteps, as JSON, or {"error": ...}."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    try:
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
        result = dataclasses.asdict(padded_steps(model, batches, out, steps=spec["steps"], warmup=spec["warmup"]))
    except Exception as e:  # recorded as the peer's failure, with the reason, by the parent
        import traceback

        result = {"error": f"{type(e).__name__}: {e}", "details": traceback.format_exc()[-20000:]}
    Path(result_path).write_text(json.dumps(result), encoding="utf-8")
    return 0


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
    with tempfile.TemporaryDirectory(prefix=f"hone-bench-{PEER_NAME}-") as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        try:
            done = subprocess.run(
                [sys.executable, "-m", __name__, str(spec_path), str(result_path)],
                capture_output=True,
                text=True,
                timeout=_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise PeerFailed(f"the Unsloth process ran past {_TIMEOUT_S} s") from None
        if not result_path.is_file():
            tail = " | ".join((done.stderr or done.stdout or "").strip().splitlines()[-5:])
            raise PeerFailed(f"the Unsloth process exited with {done.returncode}: {tail}")
        data_out = json.loads(result_path.read_text(encoding="utf-8"))
    if "error" in data_out:
        raise PeerFailed(f"Unsloth failed: {data_out['error']}\n{data_out.get('details', '')}")
    known = {f.name for f in dataclasses.fields(RunSteps)}
    return RunSteps(**{k: v for k, v in data_out.items() if k in known})


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1], sys.argv[2]))

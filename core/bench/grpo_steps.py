"""GRPO's whole step: Hone's Trainer (`train.method = "grpo"`) against TRL's GRPOTrainer without vLLM, in one
process, on the same model folder, prompts, group, answer length and reward.

The prompts are one user message of `prompt_words` words that are each one token, so every prompt renders to the
same length and both trainers take exactly `prompts_per_step` prompts a step (Hone packs prompts by tokens). TRL is
set up as its documentation does with peft (LoRA on every linear layer, `generate` for sampling, gradient
checkpointing on a GPU); both use β = 0, the DAPO loss and one update per generation batch. A step is timed from
its start to the end of its optimizer update, the GPU synchronized; the reward (the share of vowels in an answer)
varies between answers, so every group has a spread to learn from.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

REWARD_SOURCE = """
def vowels(completion, prompt, row):
    return sum(c in "aeiou" for c in completion.lower()) / max(len(completion), 1)
"""
LR = 1e-5


def vowels(completions, **kwargs) -> list[float]:
    """TRL's form of the same reward: a list of scores for a list of answers (text, or one assistant message)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in t.lower()) / max(len(t), 1) for t in texts]


@dataclass
class StepRun:
    name: str
    description: str
    times: list[float] = field(default_factory=list)
    peak_gib: float | None = None
    trainable: int | None = None
    error: str = ""
    details: str = ""  # what a failed run said beyond its first line (a peer's traceback)

    def median(self, warmup: int) -> float | None:
        timed = self.times[warmup:]
        return statistics.median(timed) if timed and not self.error else None


def single_token_words(tokenizer, words) -> list[str]:
    """The words that are one token after a space, so a prompt's tokens are its words."""
    return [w for w in words if len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1]


def write_prompts(folder: Path, tokenizer, words, count: int, prompt_words: int) -> tuple[Path, list[dict]]:
    """`count` prompts as Hone's rows (messages ending on a user turn) and as TRL's (a conversational prompt)."""
    pool = single_token_words(tokenizer, words)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(pool) for _ in range(prompt_words)) for _ in range(count)]
    path = folder / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts), encoding="utf-8"
    )
    return path, [{"prompt": [{"role": "user", "content": t}]} for t in texts]


def trl_grpo_steps(model_dir: Path, rows: list[dict], out_dir: Path, *, steps: int, warmup: int, prompts_per_step: int,
                   group: int, completion: int, lora_r: int, adapted=None, name: str = "trl",
                   description: str = "") -> StepRun:  # fmt: skip
    """TRL's GRPOTrainer with a peft LoraConfig and `generate` (no vLLM), `steps` optimizer steps.

    `adapted`: a model already loaded with its LoRA and its own gradient checkpointing (the Unsloth peer's), trained
    as given: no peft config and no checkpointing of TRL's; the run is then `name` with that `description`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hone.core.bench.trl_setup import common_args, lora_config
    from hone.core.models.hub_kernels import from_pretrained_options

    cuda = torch.cuda.is_available()
    checkpointing = ", gradient checkpointing" if cuda else ""
    run = StepRun(name, description or f"TRL's GRPOTrainer with peft, transformers' generate (no vLLM){checkpointing}")

    class Clock(TrainerCallback):
        began = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                if len(run.times) == warmup:
                    torch.cuda.reset_peak_memory_stats()
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            run.times.append(time.perf_counter() - self.began)

    dtype = torch.bfloat16 if cuda else torch.float32
    if adapted is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **from_pretrained_options())
        model = model.to("cuda" if cuda else "cpu")
    else:
        model = adapted
    args = GRPOConfig(
        **common_args(out_dir, steps=steps, lr=LR, cuda=cuda, checkpointing=cuda and adapted is None),
        per_device_train_batch_size=prompts_per_step * group,
        num_generations=group,
        max_completion_length=completion,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        loss_type="dapo",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=vowels,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=lora_config(lora_r) if adapted is None else None,
        callbacks=[Clock()],
    )
    run.trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    trainer.train()
    run.peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del trainer, model
    return run


def hone_grpo_steps(model_dir: Path, prompts: Path, reward_file: Path, runs_dir: Path, *, steps: int, warmup: int,
                    batch_tokens: int, group: int, completion: int, lora_r: int) -> StepRun:  # fmt: skip
    """Hone's Trainer with train.method = grpo on the same prompts, group, answer length and reward."""
    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    run = StepRun(
        "hone", "Hone's Trainer, train.method = grpo: static-cache sampler, packed log-probs, its speed paths"
    )
    reward = '[{kind = "python", function = "vowels"}]'
    cuda = torch.cuda.is_available()
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(prompts))}]",
            f"output.runs_dir={json.dumps(str(runs_dir))}",
            f"model.dtype={'bfloat16' if cuda else 'float32'}",
            f"data.max_length={batch_tokens}",
            f"train.batch_tokens={batch_tokens}",
            f"train.max_steps={steps}",
            f"train.lr={LR}",
            'train.schedule="constant"',
            "train.warmup_steps=0",
            f"lora.r={lora_r}",
            f"lora.alpha={2 * lora_r}",
            "output.checkpoint_every=0",
            'train.method="grpo"',
            f"grpo.num_generations={group}",
            f"grpo.max_completion_length={completion}",
            "grpo.beta=0.0",
            'grpo.loss_type="dapo"',
            f"grpo.rewards={reward}",
            f"grpo.reward_file={json.dumps(str(reward_file))}",
        ]
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for event in Trainer(config).run():
        if isinstance(event, events.StepMetrics):
            run.times.append(event.step_time)
            if event.step == warmup and cuda:
                torch.cuda.reset_peak_memory_stats()
        elif isinstance(event, events.RunStarted):
            run.trainable = event.params_trainable
            run.description += f" (sampling: {event.speed_paths.get('sampling', '?')})"
        elif isinstance(event, events.RunFailed):
            run.error = event.reason
    run.peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return run

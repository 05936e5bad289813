"""The GRPO demo's prompts: add two small numbers and reply with one line of JSON, `{"sum": N}`.

No reference answer is trained on: two rewards check each sampled reply by themselves (GRPO_REWARDS). Half the
reward is the form, the reply being exactly that one line of JSON (a regex); half is the number, the last number
in the reply being the sum. A reply scores 1.0 only when both hold.

SmolLM2-135M-Instruct understands the request but mostly answers in prose ("13 + 14 = 27."), in JSON of its own
shape or in JSON spread over several lines, so the base model's reward on the held-out prompts is well below 1.
A few minutes of GRPO on two CPU cores teach it the form and raise the reward. (Answers inside <answer></answer>
tags were tried first: the base model never wrote the tags, which leaves a group of samples no reward to compare.)

The prompts are made by code from a seed, like the other demos' rows; `write_grpo_dataset()` writes them into a
folder (`hone demo --method grpo` keeps them in Hone's cache folder). No pair of numbers, in either order, is in
both splits.
"""

from __future__ import annotations

import random
from pathlib import Path

from hone.core.demo.files import write_splits

# A system turn of its own (in place of the chat template's default one): with it the base model writes the JSON
# line in about a quarter of its samples, often enough for a group of four to hold one to learn from (with the
# default one, or "Reply with JSON only.", in 1 of 16 to 32).
SYSTEM = "You are a calculator that replies in JSON."
INSTRUCTION = 'What is {a} + {b}? Reply with one line of JSON: {{"sum": <the number>}}'
# The form a reply must have: the one line, nothing around it but whitespace (one space after the colon, or none).
FORMAT_PATTERN = r'\s*\{"sum": ?-?\d+\}\s*'
# The rewards, as the run's [grpo] rewards table: the form and the number, half each, so a right reply scores 1.
GRPO_REWARDS = [
    {"kind": "regex", "pattern": FORMAT_PATTERN, "fullmatch": True, "weight": 0.5, "name": "format"},
    {"kind": "numeric", "column": "answer", "weight": 0.5, "name": "sum"},
]
# Numbers added: 1 to 10. The base model adds these right in about a quarter of its replies, often enough for GRPO to
# keep the sums while it learns the form (with numbers up to 20 it was right in under a sixth, and the fine-tune
# learnt the form and lost the sums).
LOWEST, HIGHEST = 1, 10
# Prompts per split, of the 55 pairs there are: 18 GRPO steps of 2 prompts, a few minutes on two CPU cores (see
# grpo.py), and 16 held-out prompts (64 replies sampled) for the share of right replies.
TRAIN_PROMPTS = 36
EVAL_PROMPTS = 16
SEED = 5


def make_prompt(a: int, b: int) -> dict:
    """One prompt row: the system turn, the question as a user turn, and the sum in the `answer` column (what the
    numeric reward reads)."""
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": INSTRUCTION.format(a=a, b=b)}],
        "answer": a + b,
    }


def make_grpo_dataset(
    n_train: int = TRAIN_PROMPTS, n_eval: int = EVAL_PROMPTS, seed: int = SEED
) -> tuple[list[dict], list[dict]]:
    """Training and held-out prompts; a pair of numbers (in either order) is in one split only."""
    pairs = [(a, b) for a in range(LOWEST, HIGHEST + 1) for b in range(a, HIGHEST + 1)]
    if n_train + n_eval > len(pairs):
        raise ValueError(f"{n_train} + {n_eval} prompts asked for, {len(pairs)} pairs of numbers exist")
    rng = random.Random(seed)
    rng.shuffle(pairs)
    # Each pair in the order the question asks it, chosen at random: "3 + 17" and "17 + 3" both occur.
    ordered = [(a, b) if rng.random() < 0.5 else (b, a) for a, b in pairs]
    return [make_prompt(a, b) for a, b in ordered[:n_train]], [
        make_prompt(a, b) for a, b in ordered[n_train : n_train + n_eval]
    ]


def write_grpo_dataset(folder: Path) -> tuple[Path, Path]:
    """Write train.jsonl and eval.jsonl into `folder` (made if missing); returns their paths. A file that already
    holds the same prompts is left as it is (its tokenized copy in the cache stays valid); a changed one is written
    under a temporary name and renamed into place, so a reader never sees half a file."""
    return write_splits(folder, make_grpo_dataset())

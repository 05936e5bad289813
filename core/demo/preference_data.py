"""The preference demo's pairs: the JSON-extraction task of text_data.py, the exact line of JSON as the chosen answer
and a plausible wrong reply as the rejected one.

The wrong replies keep the facts and break the answer's form in ways SmolLM2-135M-Instruct itself finds at least
as likely as the exact line: the JSON spread over several lines (the instruction asks for one), the job capitalised
(the text writes it in lower case), the age quoted (a string, not a number). So the base model ranks most held-out
pairs wrong, and a few minutes of preference training teach it which form is wanted. (Other wrong forms were tried:
a code fence, a sentence of prose before or after the JSON, capitalised keys, a Python dict, a wrong age or city;
the base already ranks those below the exact line, which leaves a demo nothing to show.)

The pairs are made by code from a seed, like the SFT demo's rows; `write_preference_dataset()` writes them into a
folder (`hone demo --method dpo` keeps them in Hone's cache folder).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from hone.core.demo.files import write_splits
from hone.core.demo.text_data import make_row

# How a rejected reply goes wrong, in turn: each split holds as many of each kind as its size allows.
REJECTIONS = ("several lines", "capitalised job", "quoted age")
# Pairs per split: enough held-out pairs for a percentage to mean something; training pairs, 12 of each kind, few
# enough for a few minutes of DPO on two CPU cores (each pair costs a forward and backward of both answers and a
# reference forward), and more than the three consistent forms need to be learnt.
TRAIN_PAIRS = 36
EVAL_PAIRS = 30
SEED = 11


def rejected_answer(facts: dict, kind: str) -> str:
    """A wrong reply to the row whose facts are `facts`, gone wrong as `kind` (one of REJECTIONS) says."""
    if kind == "several lines":
        return json.dumps(facts, indent=2)
    if kind == "capitalised job":
        return json.dumps({**facts, "job": facts["job"].capitalize()})
    if kind == "quoted age":
        return json.dumps({**facts, "age": str(facts["age"])})
    raise ValueError(f"unknown rejection {kind!r}: one of {', '.join(REJECTIONS)}")


def make_pair(rng: random.Random, kind: str) -> tuple[dict, dict]:
    """One preference row {"prompt": [messages], "chosen": [messages], "rejected": [messages]} whose rejected answer
    goes wrong as `kind` says, and the facts it encodes."""
    row, facts = make_row(rng)
    *prompt, answer = row["messages"]
    pair = {
        "prompt": prompt,
        "chosen": [answer],
        "rejected": [{"role": "assistant", "content": rejected_answer(facts, kind)}],
    }
    return pair, facts


def make_preference_dataset(
    n_train: int = TRAIN_PAIRS, n_eval: int = EVAL_PAIRS, seed: int = SEED
) -> tuple[list[dict], list[dict]]:
    """Training and held-out pairs; no held-out person (name) appears in training."""
    rng = random.Random(seed)
    train: list[dict] = []
    held_out: list[dict] = []
    seen: set[str] = set()
    while len(train) < n_train:
        pair, facts = make_pair(rng, REJECTIONS[len(train) % len(REJECTIONS)])
        seen.add(facts["name"])
        train.append(pair)
    while len(held_out) < n_eval:
        pair, facts = make_pair(rng, REJECTIONS[len(held_out) % len(REJECTIONS)])
        if facts["name"] not in seen:
            seen.add(facts["name"])
            held_out.append(pair)
    return train, held_out


def write_preference_dataset(folder: Path) -> tuple[Path, Path]:
    """Write train.jsonl and eval.jsonl into `folder` (made if missing); returns their paths. A file that already
    holds the same pairs is left as it is (its tokenized copy in the cache stays valid); a changed one is written under
    a temporary name and renamed into place, so a reader never sees half a file."""
    return write_splits(folder, make_preference_dataset())

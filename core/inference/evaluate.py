"""Held-out prompts answered by the base model and by the fine-tune, scored against their reference replies.

Each prompt with a reference (a final assistant turn, or a completion) is answered greedily by both models (one
copy of the base weights, the adapter switched off for the base) and scored two ways: exact match (whitespace
ignored at the ends) and word F1, the overlap of the answer's words with the reference's (1.0 = the same words).
No Qt: `hone eval` prints the result and the studio's Chat page shows it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hone.core.errors import HoneError
from hone.core.inference.chat import BASE, TUNED, ChatModels, GenerationSettings, StopFlag
from hone.core.inference.prompts import Prompt

_WORD = re.compile(r"\w+", re.UNICODE)


def word_f1(answer: str, reference: str) -> float:
    """The harmonic mean of the share of the answer's words found in the reference and the share of the
    reference's words found in the answer (case ignored); 1.0 for two empty texts."""
    got, want = Counter(_WORD.findall(answer.lower())), Counter(_WORD.findall(reference.lower()))
    if not got or not want:
        return float(got == want)
    common = sum((got & want).values())
    if not common:
        return 0.0
    precision, recall = common / sum(got.values()), common / sum(want.values())
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Answered:
    """One prompt: its row in the file, the question (its last user turn), the reference and both answers."""

    row: int
    question: str
    reference: str
    base: str
    tuned: str

    def exact(self, side: str) -> bool:
        return (self.base if side == BASE else self.tuned).strip() == self.reference.strip()

    def f1(self, side: str) -> float:
        return word_f1(self.base if side == BASE else self.tuned, self.reference)


@dataclass(frozen=True)
class Comparison:
    """Every prompt answered, in file order; `complete` is False when it was stopped early."""

    answered: list[Answered]
    asked: int
    complete: bool = True

    def exact_matches(self, side: str) -> int:
        return sum(a.exact(side) for a in self.answered)

    def mean_f1(self, side: str) -> float:
        return sum(a.f1(side) for a in self.answered) / max(len(self.answered), 1)

    def summary(self) -> str:
        n = len(self.answered)
        parts = [
            f"{name}: exact {self.exact_matches(side)}/{n}, word F1 {self.mean_f1(side):.2f}"
            for name, side in (("base", BASE), ("fine-tuned", TUNED))
        ]
        done = "" if self.complete else f" (stopped after {n} of {self.asked})"
        return "; ".join(parts) + done


def held_out_file(config, given: str | Path | None = None) -> Path:
    """The file to evaluate a run on: `given`, else the run's first evaluation file (`data.eval`).

    Raises:
        HoneError: neither.
    """
    from hone.core.resources import BUNDLED_PREFIX, resolve_bundled

    if given:
        return Path(given).expanduser()
    if not config.data.eval:
        raise HoneError("the run has no evaluation data (data.eval)", "give a file of held-out rows")
    first = str(config.data.eval[0])
    return resolve_bundled(first) if first.startswith(BUNDLED_PREFIX) else Path(first).expanduser()


def with_references(prompts: list[Prompt], limit: int | None = None) -> list[Prompt]:
    """The prompts that carry a reference reply, the first `limit` of them.

    Raises:
        HoneError: none does.
    """
    usable = [p for p in prompts if p.reference is not None and p.reference.strip()]
    if not usable:
        raise HoneError(
            "no row of the file holds a reference reply to score against",
            'use rows with a final assistant turn ({"messages": [..., {"role": "assistant", ...}]}) or a "completion"',
        )
    return usable[:limit] if limit else usable


def fitting_settings(models: ChatModels, prompts: list[Prompt], slack: int = 8) -> GenerationSettings:
    """Greedy, with room for the longest reference and a few tokens more: generating further cannot turn a
    wrong answer right, and on a CPU every token counts."""
    tokenizer = getattr(models.tokenizer, "tokenizer", models.tokenizer)
    longest = max(len(tokenizer(p.reference or "", add_special_tokens=False)["input_ids"]) for p in prompts)
    return GenerationSettings(max_new_tokens=longest + slack)


def compare(
    models: ChatModels,
    prompts: list[Prompt],
    settings: GenerationSettings | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    stop: StopFlag | None = None,
) -> Comparison:
    """Answer each prompt (with a reference) by the base and the fine-tune; `progress(done, total)` after each.
    `settings`: None = greedy up to the longest reference (`fitting_settings`).

    Raises:
        HoneError: the models have no adapter to compare with (`models.has_adapter` is False).
    """
    if not models.has_adapter:
        raise HoneError("there is no fine-tune to compare with the base", "evaluate a run that has an adapter")
    settings = settings or fitting_settings(models, prompts)
    answered = []
    for prompt in prompts:
        replies = {BASE: [], TUNED: []}
        for side, piece in models.stream_both(prompt.messages, settings, stop=stop):
            replies[side].append(piece)
        if stop is not None and stop.is_set():  # this prompt's answers were cut short: not scored
            return Comparison(answered, len(prompts), complete=False)
        question = next(m["content"] for m in reversed(prompt.messages) if m["role"] == "user")
        answered.append(
            Answered(prompt.row, question, prompt.reference or "", "".join(replies[BASE]), "".join(replies[TUNED]))
        )
        if progress is not None:
            progress(len(answered), len(prompts))
    return Comparison(answered, len(prompts))

"""`hone demo`: fine-tune the bundled SmolLM2-135M-Instruct on the bundled JSON-extraction task and show held-out
exact match before and after.

Exact match is the whole point of the task (a strict answer format), so the score is strict: the generated
answer, stripped of surrounding whitespace, must equal the reference line character for character.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hone.core.config import DEMO_EVAL_DATA, RunConfig
from hone.core.data.template import render_conversation
from hone.core.demo.before_after import ScorePhase, SilentPhase, base_demo_config, train_and_rescore
from hone.core.resources import resolve_bundled

if TYPE_CHECKING:
    from hone.core.demo.grpo import GrpoDemoResult
    from hone.core.demo.preference import PreferenceDemoResult


def demo_config(
    runs_dir: str | None = None, steps: int | None = None, model: str | None = None, method: str = "sft"
) -> RunConfig:
    """The bundled demo config, optionally with another runs folder, step count or model. A `method` other than sft
    gives the preference demo's config (dpo, simpo, orpo, kto: hone.core.demo.preference) or the GRPO demo's (grpo:
    hone.core.demo.grpo) instead.

    Raises:
        ConfigError: `method` is none of those.
    """
    if method == "grpo":
        from hone.core.demo.grpo import grpo_demo_config

        return grpo_demo_config(runs_dir, steps, model)
    if method != "sft":
        from hone.core.demo.preference import preference_demo_config

        return preference_demo_config(method, runs_dir, steps, model)
    return base_demo_config(runs_dir, steps, model)


def load_rows(name: str) -> list[dict]:
    path = resolve_bundled(name) if name.startswith("bundled:") else Path(name)
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class Score:
    correct: int
    total: int
    examples: list[tuple[str, str]]  # (expected, got), the first few

    @property
    def rate(self) -> float:
        return self.correct / max(self.total, 1)


# (rows answered so far, rows in all), called after each batch while a model is scored.
ScoreProgress = Callable[[int, int], None]


def generate_answers(
    model,
    tokenizer,
    rows: list[dict],
    *,
    max_new_tokens: int = 40,
    batch_size: int = 20,
    progress: ScoreProgress | None = None,
) -> list[str]:
    """Greedy answers to each row's conversation minus its last (assistant) turn, batched with left padding;
    `progress(done, total)` after each batch."""
    import torch

    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    answers = []
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            prompts = [render_conversation(tokenizer, r["messages"][:-1], add_generation_prompt=True) for r in chunk]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
                )
            answers += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            if progress is not None:
                progress(len(answers), len(rows))
    finally:
        tokenizer.padding_side = side
    return answers


def exact_match(model, tokenizer, rows: list[dict], **kwargs) -> Score:
    expected = [r["messages"][-1]["content"] for r in rows]
    # Generating past the longest reference cannot turn a wrong answer right; +2 leaves room for the end token.
    longest = max(len(tokenizer(e, add_special_tokens=False)["input_ids"]) for e in expected)
    kwargs.setdefault("max_new_tokens", longest + 2)
    answers = generate_answers(model, tokenizer, rows, **kwargs)
    correct = sum(a.strip() == e.strip() for a, e in zip(answers, expected))
    return Score(correct, len(rows), list(zip(expected, answers))[:3])


@dataclass(frozen=True)
class DemoResult:
    before: Score
    after: Score
    run_dir: str
    adapter_dir: str


def run_demo(
    config: RunConfig,
    *,
    eval_rows: int | None = None,
    on_stage: Callable[[str], None] | None = None,
    phase: ScorePhase | None = None,
) -> Generator[object, None, DemoResult | PreferenceDemoResult | GrpoDemoResult | None]:
    """Score the base model, train, score the adapter. Yields the run's events; its return value (the
    generator's StopIteration value) is the DemoResult, or None when training failed. `on_stage(text)` hears each
    stage; the two scorings run inside `phase(text, rows)`, told the rows scored so far.

    A preference config (`demo_config(method="dpo")`) runs the preference demo instead, which returns a
    hone.core.demo.preference.PreferenceDemoResult; a GRPO config (`demo_config(method="grpo")`) the GRPO demo, which
    returns a hone.core.demo.grpo.GrpoDemoResult."""
    from hone.core.models.load import load_model

    if config.train.method == "grpo":
        from hone.core.demo.grpo import run_grpo_demo

        return (yield from run_grpo_demo(config, eval_rows=eval_rows, on_stage=on_stage, phase=phase))

    if config.train.method != "sft":
        from hone.core.demo.preference import run_preference_demo

        return (yield from run_preference_demo(config, eval_rows=eval_rows, on_stage=on_stage, phase=phase))

    stage = on_stage or (lambda text: None)
    phase = phase or SilentPhase
    rows = load_rows(config.data.eval[0] if config.data.eval else DEMO_EVAL_DATA)[:eval_rows]

    def score(model, who: str) -> Score:
        with phase(f"scoring {who} on {len(rows)} held-out rows", len(rows)) as p:
            return exact_match(model, loaded.tokenizer, rows, progress=lambda done, total: p.update(done))

    stage("loading the base model")
    loaded = load_model(config.model, for_training=False)
    before = score(loaded.model, "the base model")
    stage(f"base model: {before.correct}/{before.total} exact")
    trained = yield from train_and_rescore(
        config, loaded.model, lambda tuned: score(tuned, "the fine-tuned model"), stage
    )
    if trained is None:
        return None
    final, after = trained
    return DemoResult(before, after, final.run_dir, final.adapter_dir)

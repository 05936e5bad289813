"""`hone demo`: fine-tune the bundled SmolLM2-135M-Instruct on the bundled JSON-extraction task and show held-out
exact match before and after.

Exact match is the whole point of the task (a strict answer format), so the score is strict: the generated
answer, stripped of surrounding whitespace, must equal the reference line character for character.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hone.core.config import DEMO_EVAL_DATA, RunConfig
from hone.core.data.template import render_conversation
from hone.core.resources import resolve_bundled, resource_path

DEMO_CONFIG = "configs/demo.toml"


def demo_config(runs_dir: str | None = None, steps: int | None = None, model: str | None = None) -> RunConfig:
    """The bundled demo config, optionally with another runs folder, step count or model."""
    config = RunConfig.load(resource_path(DEMO_CONFIG))
    overrides = []
    if runs_dir:
        overrides.append(f"output.runs_dir={json.dumps(runs_dir)}")
    if steps:
        overrides.append(f"train.max_steps={steps}")
    if model:
        overrides.append(f"model.name_or_path={json.dumps(model)}")
    return config.with_overrides(overrides) if overrides else config


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


class ScorePhase(Protocol):
    """What `run_demo` reports scoring through: `phase(text, total)` is a context manager whose `update(done)`
    takes the rows scored so far (hone.core.cli.console.Phase is one)."""

    def __call__(self, text: str, total: int) -> contextlib.AbstractContextManager: ...


class _SilentPhase:
    def __init__(self, text: str, total: int):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def update(self, done: int) -> None:
        pass


def run_demo(
    config: RunConfig,
    *,
    eval_rows: int | None = None,
    on_stage: Callable[[str], None] | None = None,
    phase: ScorePhase | None = None,
) -> Generator[object, None, DemoResult | None]:
    """Score the base model, train, score the adapter. Yields the run's events; its return value (the
    generator's StopIteration value) is the DemoResult, or None when training failed. `on_stage(text)` hears each
    stage; the two scorings run inside `phase(text, rows)`, told the rows scored so far."""
    from hone.core.models.load import load_model

    stage = on_stage or (lambda text: None)
    phase = phase or _SilentPhase
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


def train_and_rescore(config: RunConfig, base_model, score: Callable, stage: Callable[[str], None]) -> Generator:
    """Train as `config` says, yielding the run's events; then load the adapter onto `base_model` and score it.
    Returns (RunFinished, score of the fine-tuned model), or None when the run did not finish."""
    from peft import PeftModel

    from hone.core.events import RunFailed, RunFinished
    from hone.core.train.trainer import Trainer

    final = None
    for event in Trainer(config).run():
        yield event
        if isinstance(event, (RunFinished, RunFailed)):
            final = event
    if not isinstance(final, RunFinished):
        return None
    stage("loading the adapter onto the base model")
    return final, score(PeftModel.from_pretrained(base_model, final.adapter_dir))

"""`hone demo --vision`: teach a small vision-language model (SmolLM2-135M-Instruct + a vision encoder and
projector from random weights, hone.core.demo.vision_model) to name the color and shape in a picture, on the bundled
shapes dataset where text-only rows sit in the same batches as image rows.

Scores, before and after, on held-out rows: color accuracy (6 colors, chance 1/6), shape accuracy (3 shapes, chance
1/3), and text-only questions the base model answers correctly (capitals), which must stay correct. An answer is
right when the greedy reply starts with the expected word (images) or contains it (text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

from hone.core.config import RunConfig
from hone.core.resources import resolve_bundled, resource_path

DEMO_VISION_CONFIG = "configs/demo_vision.toml"
DEMO_VISION_EVAL = "bundled:shapes_vqa/eval.jsonl"
# Greedy tokens generated per answer: the one-word image answers need at most two tokens plus the end of turn;
# the capital sentences ("The capital of Canada is Ottawa.") about ten.
IMAGE_ANSWER_TOKENS = 3
TEXT_ANSWER_TOKENS = 12
CHANCE = {"color": 1 / 6, "shape": 1 / 3}


def vision_demo_config(runs_dir: str | None = None, steps: int | None = None) -> RunConfig:
    """The demo's RunConfig, pointing at the demo model folder (built on first use)."""
    from hone.core.demo.vision_model import demo_model_folder

    overrides = [f"model.name_or_path={json.dumps(str(demo_model_folder()))}"]
    if runs_dir:
        overrides.append(f"output.runs_dir={json.dumps(runs_dir)}")
    if steps:
        overrides.append(f"train.max_steps={steps}")
    return RunConfig.load(resource_path(DEMO_VISION_CONFIG)).with_overrides(overrides)


@dataclass(frozen=True)
class VisionScore:
    """Correct answers per kind of held-out question ("color", "shape", "text"): (correct, total)."""

    counts: dict[str, tuple[int, int]]
    examples: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, expected, got), a few per kind

    def rate(self, kind: str) -> float:
        correct, total = self.counts.get(kind, (0, 0))
        return correct / max(total, 1)


def _is_right(kind: str, expected: str, got: str) -> bool:
    if kind == "text":
        return expected.lower() in got.lower()
    return re.match(rf"\s*{re.escape(expected)}\b", got, flags=re.IGNORECASE) is not None


def answer_questions(
    model, processor, questions, base_dir: Path, *, image_max_side: int, batch_size: int = 12
) -> list[str]:
    """Greedy replies to each question's conversation minus its answer, batched with left padding."""
    import torch

    from hone.core.data.images import load_image, parse_image_ref

    tokenizer = processor.tokenizer
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    replies: list[str] = [""] * len(questions)
    try:
        for kind in ("image", "text"):
            chosen = [i for i, q in enumerate(questions) if (q.kind == "text") == (kind == "text")]
            for start in range(0, len(chosen), batch_size):
                part = chosen[start : start + batch_size]
                prompts, images = [], []
                for i in part:
                    messages = questions[i].row["messages"][:-1]
                    prompts.append(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
                    for message in messages:
                        for p in message["content"] if isinstance(message["content"], list) else []:
                            if p["type"] == "image":
                                ref = parse_image_ref(p["image"], base_dir, "image")
                                images.append(load_image(ref, image_max_side))
                inputs = processor(
                    text=prompts, images=images or None, padding=True, add_special_tokens=False, return_tensors="pt"
                ).to(model.device)
                new = IMAGE_ANSWER_TOKENS if kind == "image" else TEXT_ANSWER_TOKENS
                with torch.no_grad():
                    out = model.generate(
                        **inputs, max_new_tokens=new, do_sample=False, pad_token_id=tokenizer.pad_token_id
                    )
                texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
                for i, text in zip(part, texts, strict=True):
                    replies[i] = text
    finally:
        tokenizer.padding_side = side
    return replies


def score(model, processor, questions, base_dir: Path, *, image_max_side: int) -> VisionScore:
    replies = answer_questions(model, processor, questions, base_dir, image_max_side=image_max_side)
    counts: dict[str, list[int]] = {}
    examples: list[tuple[str, str, str]] = []
    for q, got in zip(questions, replies, strict=True):
        tally = counts.setdefault(q.kind, [0, 0])
        tally[0] += _is_right(q.kind, q.answer, got)
        tally[1] += 1
        if sum(1 for e in examples if e[0] == q.kind) < 2:
            examples.append((q.kind, q.answer, got.strip()))
    return VisionScore({k: (c, t) for k, (c, t) in counts.items()}, examples)


@dataclass(frozen=True)
class VisionDemoResult:
    before: VisionScore
    after: VisionScore
    run_dir: str
    adapter_dir: str


def run_vision_demo(
    config: RunConfig,
    *,
    eval_rows: int | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> Generator[object, None, VisionDemoResult | None]:
    """Score the base model, train, score the adapter. Yields the run's events; the generator's return value is
    the VisionDemoResult (None when training failed)."""
    from hone.core.demo.text import train_and_rescore
    from hone.core.demo.vision_data import read_questions
    from hone.core.models.load import load_model

    stage = on_stage or (lambda text: None)
    eval_file = resolve_bundled(DEMO_VISION_EVAL)
    questions = read_questions(eval_file)
    if eval_rows:  # keep the mix: the first N of each kind, in proportion
        kinds = {q.kind for q in questions}
        per = max(1, eval_rows // len(kinds))
        questions = [q for k in sorted(kinds) for q in [x for x in questions if x.kind == k][:per]]
    side = config.data.image_max_side
    stage("loading the base model (SmolLM2-135M-Instruct + a vision encoder and projector from random weights)")
    loaded = load_model(config.model, for_training=False)
    stage(f"scoring the base model on {len(questions)} held-out questions")
    before = score(loaded.model, loaded.tokenizer, questions, eval_file.parent, image_max_side=side)

    def rescore(tuned) -> VisionScore:
        stage(f"scoring the fine-tuned model on {len(questions)} held-out questions")
        return score(tuned, loaded.tokenizer, questions, eval_file.parent, image_max_side=side)

    trained = yield from train_and_rescore(config, loaded.model, rescore, stage)
    if trained is None:
        return None
    final, after = trained
    return VisionDemoResult(before, after, final.run_dir, final.adapter_dir)

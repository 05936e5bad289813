"""The vision demo's dataset: simple shapes in simple colors, drawn with Pillow, with questions and one-word answers,
mixed with text-only questions the base model already answers.

The shipped files (resources/datasets/shapes_vqa/) are `write_shapes_dataset()`'s output; a test regenerates them
and compares (the JSONL byte for byte, the images pixel for pixel), so the dataset stays reproducible: a change
here means regenerating the shipped files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

COLORS = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
COLOR_QUESTIONS = ("What color is the shape?", "What color is it?", "Which color do you see?")
SHAPE_QUESTIONS = ("What shape is this?", "What shape is it?", "Which shape is in the picture?")
# Facts SmolLM2-135M-Instruct gets right on its own; training keeps them right. Held-out ones are only scored.
CAPITALS_TRAIN = {"France": "Paris", "Italy": "Rome", "Japan": "Tokyo", "Germany": "Berlin", "Spain": "Madrid"}
CAPITALS_EVAL = {"England": "London", "Canada": "Ottawa", "Russia": "Moscow", "Egypt": "Cairo"}
OPPOSITES_TRAIN = {"hot": "cold", "up": "down"}

IMAGE_SIDE = 32  # pixels: small enough for a CPU demo, large enough that circles, squares and triangles differ
_SUPERSAMPLE = 4  # drawn 4x larger, then scaled down: smooth edges without anti-aliased drawing calls


@dataclass(frozen=True)
class Question:
    """One held-out question with its expected answer word (for scoring)."""

    row: dict
    kind: str  # "color", "shape" or "text"
    answer: str


def draw_shape(color: str, shape: str, rng: random.Random):
    """A `shape` filled with `color` on white, with random size and position jitter (a PIL image, 32 x 32)."""
    from PIL import Image, ImageDraw

    side = IMAGE_SIDE * _SUPERSAMPLE
    image = Image.new("RGB", (side, side), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    radius = rng.uniform(0.28, 0.42) * side
    cx, cy = (side / 2 + rng.uniform(-0.08, 0.08) * side for _ in range(2))
    fill = COLORS[color]
    if shape == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=fill)
    elif shape == "square":
        half = radius * 0.85
        draw.rectangle([cx - half, cy - half, cx + half, cy + half], fill=fill)
    else:
        draw.polygon([(cx, cy - radius), (cx - radius, cy + 0.8 * radius), (cx + radius, cy + 0.8 * radius)], fill=fill)
    return image.resize((IMAGE_SIDE, IMAGE_SIDE), Image.Resampling.LANCZOS)


def _image_turn(path: str, question: str) -> dict:
    return {"role": "user", "content": [{"type": "image", "image": path}, {"type": "text", "text": question}]}


def _text_row(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def _capital(country: str, city: str) -> tuple[str, str]:
    return f"What is the capital of {country}?", f"The capital of {country} is {city}."


def make_dataset(n_train_images: int = 320, n_eval_images: int = 36, n_train_text: int = 80, seed: int = 11):
    """(train rows, held-out questions, images {relative path: PIL image}).

    Train image rows ask about the color, the shape, or both (in either order) of one image; every held-out image
    row asks one question. Text-only rows ask for capitals and opposites.
    """
    rng = random.Random(seed)
    images: dict[str, object] = {}
    train: list[dict] = []

    def new_image(prefix: str, n: int) -> tuple[str, str, str]:
        color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
        path = f"images/{prefix}_{n:04d}.png"
        images[path] = draw_shape(color, shape, rng)
        return path, color, shape

    for n in range(n_train_images):
        path, color, shape = new_image("train", n)
        turns = [(rng.choice(COLOR_QUESTIONS), color), (rng.choice(SHAPE_QUESTIONS), shape)]
        pick = rng.random()
        if pick < 0.25:
            turns.reverse()
        elif pick < 0.5:
            turns = [rng.choice(turns)]
        messages = [_image_turn(path, turns[0][0]), {"role": "assistant", "content": turns[0][1]}]
        for question, answer in turns[1:]:
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        train.append({"messages": messages})
    facts = [_capital(c, city) for c, city in CAPITALS_TRAIN.items()]
    facts += [(f"What is the opposite of {w}?", f"The opposite of {w} is {o}.") for w, o in OPPOSITES_TRAIN.items()]
    for _ in range(n_train_text):
        train.append(_text_row(*rng.choice(facts)))
    rng.shuffle(train)

    held_out: list[Question] = []
    for n in range(n_eval_images):
        path, color, shape = new_image("eval", n)
        kind = "color" if n % 2 == 0 else "shape"
        question = rng.choice(COLOR_QUESTIONS if kind == "color" else SHAPE_QUESTIONS)
        answer = color if kind == "color" else shape
        row = {"messages": [_image_turn(path, question), {"role": "assistant", "content": answer}]}
        held_out.append(Question(row, kind, answer))
    for country, city in CAPITALS_EVAL.items():
        held_out.append(Question(_text_row(*_capital(country, city)), "text", city))
    return train, held_out, images


def write_shapes_dataset(folder: Path) -> None:
    """Write the dataset under `folder` (resources/datasets/shapes_vqa/ is this function's output):

    train.jsonl   image rows (one or two questions about one image) and text-only rows
    eval.jsonl    held-out images, one question each, and held-out text-only questions
    images/       32 x 32 PNG files
    """
    train, held_out, images = make_dataset()
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for path, image in images.items():
        image.save(folder / path, optimize=False)
    with open(folder / "train.jsonl", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(row) + "\n" for row in train)
    with open(folder / "eval.jsonl", "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps({**q.row, "kind": q.kind, "answer": q.answer}) + "\n" for q in held_out)


def read_questions(path: Path) -> list[Question]:
    """The held-out questions of an eval.jsonl written by `write_shapes_dataset`."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                out.append(Question({"messages": record["messages"]}, record["kind"], record["answer"]))
    return out

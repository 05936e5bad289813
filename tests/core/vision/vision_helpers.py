"""Helpers for the vision tests: which families run here, images drawn with Pillow, chat rows."""

from __future__ import annotations

import json

from hone.core.vision import tiny

# Families whose processor this transformers can build here (Idefics3's image processor needs torchvision on 5.17).
KINDS = [k for k in tiny.KINDS if tiny.available(k) is None]
PACKED_KINDS = [k for k in KINDS if k != "gemma3"]


def draw(path, size, color, shape="square"):
    """A `shape` of `color` on white, `size` = (width, height); returns the path."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, "white")
    box = [size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4]
    draw_ = ImageDraw.Draw(image)
    (draw_.ellipse if shape == "circle" else draw_.rectangle)(box, fill=color)
    image.save(path)
    return path


def user(*parts):
    return {
        "role": "user",
        "content": [
            {"type": "image", "image": p} if p.endswith(".png") else {"type": "text", "text": p} for p in parts
        ],
    }


def reply(text):
    return {"role": "assistant", "content": text}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path

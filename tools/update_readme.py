"""Rewrite README.md's config reference from RunConfig's field metadata (run after changing a config field)."""

from __future__ import annotations

import re
from pathlib import Path

from hone.core.config import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def updated(text: str) -> str:
    block = f"{START}\n{reference_markdown()}{END}"
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)


if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[1] / "README.md"
    readme.write_text(updated(readme.read_text(encoding="utf-8")), encoding="utf-8")

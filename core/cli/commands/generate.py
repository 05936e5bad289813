"""`hone generate RUN_DIR --prompts FILE --out FILE [--base] [--max-new-tokens N] [--temperature 0]`.

Batch inference with a run's fine-tune: every prompt of FILE answered in turn, one JSONL row per prompt written to
--out as soon as it is done, in the order of the prompts. Every prompt file row is read and checked before the
model loads: a row that cannot be a prompt is named (file:row and why) on stderr, skipped and counted at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hone.core.api import read_prompts
from hone.core.errors import HoneError


def add_parser(sub) -> argparse.ArgumentParser:
    from hone.core.cli.commands.chat import add_generation_options

    p = sub.add_parser(
        "generate",
        help="answer a file of prompts with a fine-tuned run (batch inference)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Answer every prompt of a file with a run's fine-tuned model (greedy by default, "
        "so the same file gives the same answers) and write one JSONL row per prompt, in order.\n\n"
        "prompts (--prompts FILE):\n"
        "  JSONL (.jsonl, or lines starting with '{'), one object per line:\n"
        '    {"prompt": "..."}                      a user message\n'
        '    {"messages": [{"role": "user", "content": "..."}, ...]}   a conversation to continue\n'
        '    a final assistant turn (or a "completion") is not sent: it is written as "reference"\n'
        "  plain text (.txt, or a first line not starting with '{'): each non-empty line is one user "
        "message\n\n"
        "output (--out FILE), one JSON object per prompt:\n"
        '  {"row": N, "prompt" (or "messages"): as given, "completion": "...", "reference": ...}\n\n'
        "A row that cannot be a prompt is named on stderr (file:row: why), skipped and counted at the "
        "end; the others are still answered.\n\n"
        "exit codes: 0 done, 2 bad input (no run, no adapter, missing model or prompts file, no "
        "usable prompt, --out in the way)",
    )
    add_generation_options(p)
    p.add_argument("--prompts", required=True, metavar="FILE", help="the prompts: JSONL or plain text lines")
    p.add_argument("--out", required=True, metavar="FILE", help="where the JSONL results go")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    return p


def _check_out(out: Path, prompts: Path, force: bool) -> None:
    if out.resolve() == prompts.resolve():
        raise HoneError(f"--out {out} is the prompts file", "write the results to another file")
    if out.is_dir():
        raise HoneError(f"--out {out} is a folder", "give a file name, e.g. --out results.jsonl")
    if out.exists() and out.stat().st_size and not force:
        raise HoneError(f"{out} already exists", "pass --force to replace it, or choose another --out")
    if not out.parent.is_dir():
        raise HoneError(f"the folder of --out ({out.parent}) does not exist", "create it or choose another --out")


def run(args) -> int:
    from rich.console import Console

    from hone.core.cli.commands.chat import load_chat_models, open_chat_run, settings_from
    from hone.core.cli.console import Phase

    settings = settings_from(args)
    prompts_path, out = Path(args.prompts).expanduser(), Path(args.out).expanduser()
    _check_out(out, prompts_path, args.force)
    run_dir, config = open_chat_run(args.run_dir, args.base)
    prompts, skipped = read_prompts(prompts_path, args.system)
    for line in skipped:
        print(f"hone: skipped {line}", file=sys.stderr)
    if not prompts:
        raise HoneError(
            f"{prompts_path} holds no usable prompt"
            + (f" ({len(skipped)} rows skipped, listed above)" if skipped else ""),
            'give one prompt per line, as plain text or JSONL rows like {"prompt": "..."}',
        )

    console = Console(stderr=True)  # progress on stderr
    models = load_chat_models(run_dir, config, args.base, console)
    done = 0
    try:
        with (
            out.open("w", encoding="utf-8") as f,
            Phase(console, f"answering {len(prompts)} prompts", total=len(prompts), unit="prompts") as phase,
        ):
            for prompt in prompts:
                completion = "".join(models.stream(prompt.messages, settings, use_adapter=not args.base))
                row = {"row": prompt.row, prompt.key: prompt.given, "completion": completion}
                if prompt.reference is not None:
                    row["reference"] = prompt.reference
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()  # a stopped batch keeps every answer it finished
                done += 1
                phase.update(done)
    except KeyboardInterrupt:
        print(f"hone: stopped after {done} of {len(prompts)} prompts; {out} holds those", file=sys.stderr)
        return 130
    print(f"wrote {done} rows to {out}", file=sys.stderr)
    if skipped:
        print(
            f"hone: {len(skipped)} of {len(prompts) + len(skipped)} rows of {prompts_path} skipped (listed above)",
            file=sys.stderr,
        )
    return 0

"""`hone generate RUN_DIR --prompts FILE --out FILE [--base] [--max-new-tokens N] [--temperature 0]`.

Batch inference with a run's fine-tune: every prompt of FILE answered in turn, one JSONL row per prompt written to
--out as soon as it is done, in the order of the prompts. Every prompt file row is read and checked before the
model loads: a row that cannot be a prompt is named (file:row and why) on stderr, skipped and counted at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError

ROLES = ("system", "user", "assistant")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")


@dataclass
class Prompt:
    """One prompt to answer.

    Attributes:
        row: its line number in the prompts file (1-based).
        key: "prompt" or "messages": how the input row gave it, and the key the output row repeats it under.
        given: the prompt as given (a string or a list of messages), without a reference reply.
        messages: the conversation the model answers (--system prepended where it has no system message).
        reference: the reply the row already held (a final assistant turn or a "completion"), if any.
    """

    row: int
    key: str
    given: Any
    messages: list[dict[str, str]]
    reference: str | None = None


class BadRow(ValueError):
    """A prompts file row that cannot be a prompt; the message says why."""


def add_parser(sub) -> argparse.ArgumentParser:
    from hone.core.cli.commands.chat import add_generation_options

    p = sub.add_parser("generate", help="answer a file of prompts with a fine-tuned run (batch inference)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Answer every prompt of a file with a run's fine-tuned model (greedy by default, "
                       "so the same file gives the same answers) and write one JSONL row per prompt, in order.\n\n"
                       "prompts (--prompts FILE):\n"
                       "  JSONL (.jsonl, or lines starting with '{'), one object per line:\n"
                       '    {"prompt": "..."}                      a user message\n'
                       '    {"messages": [{"role": "user", "content": "..."}, ...]}   a conversation to continue\n'
                       "    a final assistant turn (or a \"completion\") is not sent: it is written as \"reference\"\n"
                       "  plain text (.txt, or a first line not starting with '{'): each non-empty line is one user "
                       "message\n\n"
                       "output (--out FILE), one JSON object per prompt:\n"
                       '  {"row": N, "prompt" (or "messages"): as given, "completion": "...", "reference": ...}\n\n'
                       "A row that cannot be a prompt is named on stderr (file:row: why), skipped and counted at the "
                       "end; the others are still answered.\n\n"
                       "exit codes: 0 done, 2 bad input (no run, no adapter, missing model or prompts file, no "
                       "usable prompt, --out in the way)")
    add_generation_options(p)
    p.add_argument("--prompts", required=True, metavar="FILE", help="the prompts: JSONL or plain text lines")
    p.add_argument("--out", required=True, metavar="FILE", help="where the JSONL results go")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    return p


def read_prompts(path: Path, system: str = "") -> tuple[list[Prompt], list[str]]:
    """The prompts of a file, and a "file:row: why" line for each row skipped.

    Raises:
        HoneError: the file is missing or unreadable.
    """
    try:
        raw_lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise HoneError(f"prompts file {path} does not exist", "check the --prompts path") from None
    except OSError as e:
        raise HoneError(f"cannot read prompts file {path}: {e.strerror}", "check the --prompts path") from None
    lines: list[tuple[int, str]] = []
    skipped: list[tuple[int, str]] = []  # (row, why)
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            skipped.append((number, f"not UTF-8 text (byte {e.start + 1})"))
            continue
        if text.strip():
            lines.append((number, text))
    jsonl = path.suffix.lower() in JSONL_SUFFIXES or (
        path.suffix.lower() not in TEXT_SUFFIXES and bool(lines) and lines[0][1].lstrip().startswith("{"))
    prompts = []
    for number, text in lines:
        try:
            prompts.append(_json_prompt(number, text) if jsonl else
                           Prompt(number, "prompt", text.strip(), [{"role": "user", "content": text.strip()}]))
        except BadRow as e:
            skipped.append((number, str(e)))
            continue
        if system and prompts[-1].messages[0]["role"] != "system":
            prompts[-1].messages.insert(0, {"role": "system", "content": system})
    return prompts, [f"{path}:{number}: {why}" for number, why in sorted(skipped)]


def _json_prompt(number: int, text: str) -> Prompt:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRow(f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(record, dict):
        raise BadRow(f"{_kind(record)}, not an object like {{\"prompt\": \"...\"}}")
    if "messages" in record:
        given, reference = _conversation(record["messages"], "messages")
        return Prompt(number, "messages", given, [dict(m) for m in given], reference)
    if "prompt" in record:
        prompt, reference = record["prompt"], _completion(record.get("completion"))
        if isinstance(prompt, list):  # TRL's conversational prompt-completion rows
            given, earlier = _conversation(prompt, "prompt")
            return Prompt(number, "prompt", given, [dict(m) for m in given], reference or earlier)
        if not isinstance(prompt, str):
            raise BadRow(f"prompt is {_kind(prompt)}, not a string")
        if not prompt.strip():
            raise BadRow("prompt is empty")
        return Prompt(number, "prompt", prompt, [{"role": "user", "content": prompt}], reference)
    found = ", ".join(map(str, record)) or "none"
    raise BadRow(f"no \"prompt\" or \"messages\" field (found: {found})")


def _conversation(messages: Any, field: str) -> tuple[list[dict[str, str]], str | None]:
    """The turns to send (a final assistant turn split off as the reference)."""
    if not isinstance(messages, list) or not messages:
        raise BadRow(f"{field} is not a non-empty list of {{\"role\", \"content\"}} objects")
    turns = []
    for k, message in enumerate(messages, start=1):
        where = f"{field}[{k}]"
        if not isinstance(message, dict):
            raise BadRow(f"{where} is {_kind(message)}, not a {{\"role\", \"content\"}} object")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise BadRow(f"{where}.role is {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise BadRow(f"{where}.content is {'missing' if content is None else 'not a string'}")
        turns.append({"role": role, "content": content})
    reference = None
    if turns[-1]["role"] == "assistant":
        reference = turns.pop()["content"]
    if not turns or turns[-1]["role"] != "user":
        raise BadRow(f"{field} has no user turn to answer at the end (roles: "
                     f"{', '.join(m['role'] for m in turns) or 'assistant only'})")
    if not turns[-1]["content"].strip():
        raise BadRow(f"{field}: the last user turn is empty")
    return turns, reference


def _kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _completion(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        content = value[-1].get("content")
        return content if isinstance(content, str) else None
    return None


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
        raise HoneError(f"{prompts_path} holds no usable prompt" + (f" ({len(skipped)} rows skipped, listed above)"
                                                                   if skipped else ""),
                        'give one prompt per line, as plain text or JSONL rows like {"prompt": "..."}')

    console = Console(stderr=True)  # progress on stderr
    models = load_chat_models(run_dir, config, args.base, console)
    done = 0
    try:
        with out.open("w", encoding="utf-8") as f, \
                Phase(console, f"answering {len(prompts)} prompts", total=len(prompts), unit="prompts") as phase:
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
        print(f"hone: {len(skipped)} of {len(prompts) + len(skipped)} rows of {prompts_path} skipped (listed "
              "above)", file=sys.stderr)
    return 0

"""`hone init [--model ID_OR_PATH] [--data FILE ...] [--out FILE]`: a commented starter run config.

Every section of RunConfig with its commonly edited keys, each under a one-line comment; the comments, defaults and
choices come from the config dataclasses (hone.core.config), never copied here. Data files given with --data are
read (their first rows only) with the data loader's own format detection; when their columns fit no known format,
the data.columns mapping the loader itself would suggest is written in, checked against those rows.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hone.core.errors import HoneError

# The keys a first config usually sets, per section; the section's other keys are named on one comment line. Which
# keys these are is a choice made here; their defaults, help and choices come from hone.core.config.
COMMON: dict[str, tuple[str, ...]] = {
    "model": ("name_or_path", "dtype"),
    "data": ("train", "eval", "eval_fraction", "format", "columns", "max_length", "train_on"),
    "lora": ("r", "alpha", "dropout", "targets", "qlora"),
    "train": (
        "max_steps",
        "epochs",
        "lr",
        "schedule",
        "warmup_ratio",
        "batch_tokens",
        "grad_accum",
        "seed",
        "eval_every",
        "method",
    ),
    "speed": ("packing", "attention", "checkpoint", "kernels", "compile"),
    "output": ("runs_dir", "name", "checkpoint_minutes", "checkpoint_every", "keep_checkpoints"),
    "preference": ("beta", "loss"),
    "grpo": ("num_generations", "max_completion_length", "beta", "loss_type", "rewards"),
}
# Rows read from each data file to detect its format: the loader decides on the first row that fits a format, and
# a few hundred rows tell a stray row from a file-wide mismatch in well under a second.
SAMPLE_ROWS = 200
# The first sentence of a help text: up to a period followed by a space and a capital or a quote ("e.g. x" goes on).
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]'\"`])\.\s+(?=[A-Z'\"`])")


@dataclass
class Detection:
    """What the first rows of one --data entry say about its format.

    Attributes:
        entry: the entry as given.
        format: the detected format (with `columns` applied), or "" when none fits or the entry was not read.
        columns: the data.columns mapping its rows need ({} = none).
        found: the columns of its first row.
        note: why it was not read or why no mapping fits.
    """

    entry: str
    format: str = ""
    columns: dict[str, str] = field(default_factory=dict)
    found: list[str] = field(default_factory=list)
    note: str = ""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "init",
        help="print a commented starter run config (TOML) for a model and data files",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print a starter run config: every section with its commonly edited keys, each "
        "with a one-line comment, defaults from Hone's config. With --data, the data files' format "
        "is detected and, when their columns need it, a data.columns mapping is filled in.\n\n"
        "  hone init --model Qwen/Qwen3-0.6B --data chats.jsonl > run.toml\n"
        "  hone train run.toml\n\n"
        "exit codes: 0 written, 2 a missing model or data file, or --out in the way",
    )
    p.add_argument(
        "--model",
        "-m",
        default=None,
        metavar="ID_OR_PATH",
        help="model to fine-tune: a Hugging Face "
        "id, a local model folder, a .gguf file or a bundled: name (default: the bundled demo model)",
    )
    p.add_argument(
        "--data",
        "-d",
        nargs="+",
        default=[],
        metavar="FILE",
        help="training data files, folders or Hugging Face dataset ids (default: the bundled demo task)",
    )
    p.add_argument("--out", "-o", default=None, metavar="FILE", help="write the config to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    return p


def detect(entry: str) -> list[Detection]:
    """Detect the format of each file of a data entry from its first SAMPLE_ROWS rows.

    Raises:
        HoneError: the entry names nothing readable.
    """
    from hone.core.api import (
        DUPLICATES_KEY,
        ColumnNames,
        RowError,
        SourceError,
        detect_format,
        read_records,
        resolve_sources,
    )

    try:
        sources = resolve_sources([entry])
    except SourceError as e:
        raise HoneError(
            e.message,
            "check the --data paths (a data file, a folder, a bundled: name or a Hugging "
            "Face dataset id like org/name)",
        ) from None
    found = []
    for source in sources:
        if source.kind == "hub":
            found.append(
                Detection(
                    source.name,
                    note="a Hugging Face dataset id, not read here (no download); "
                    'format = "auto" detects it when the run starts',
                )
            )
            continue
        records = []
        try:
            for _, record in read_records(source):
                if isinstance(record, dict):
                    record.pop(DUPLICATES_KEY, None)
                    records.append(record)
                if len(records) >= SAMPLE_ROWS:
                    break
        except SourceError as e:
            raise HoneError(e.message, "check the --data file") from None
        if not records:
            found.append(Detection(source.name, note="no readable row (`hone data check` says why)"))
            continue
        detection = Detection(source.name, found=[str(k) for k in records[0]])
        for mapping in ({}, _suggested_mapping(detection.found)):
            if mapping is None:
                break
            formats: Counter[str] = Counter()
            for record in records:
                with contextlib.suppress(RowError):  # a row of no format: the loader skips and reports it
                    formats[detect_format(record, ColumnNames(mapping))] += 1
            if formats:
                detection.format, detection.columns = formats.most_common(1)[0][0], mapping
                break
        if not detection.format:
            detection.note = (
                f"no known format in its columns ({_names(detection.found)}): map yours in "
                "data.columns (Hone's name = your column)"
            )
        found.append(detection)
    return found


def _suggested_mapping(names: list[str]) -> dict[str, str] | None:
    """The data.columns the loader suggests for these columns, or None when it can only suggest placeholders."""
    from hone.core.api import suggest_columns
    from hone.core.config import tomllib

    mapping = tomllib.loads(f"columns = {suggest_columns(names)}")["columns"]
    return mapping if all(v in names for v in mapping.values()) else None


def starter_toml(model: str | None, data: list[str], detections: list[Detection]) -> str:
    """The commented config text: RunConfig's defaults with `model` and `data` filled in."""
    from hone.core.config import SECTIONS, RunConfig, _toml_value

    defaults = RunConfig().to_dict()
    values = {name: dict(section) for name, section in defaults.items()}
    if model:
        values["model"]["name_or_path"] = model
    if data:
        values["data"]["train"] = list(data)
    formats = {d.format for d in detections if d.format}
    if len(formats) == 1 and all(d.format for d in detections):
        values["data"]["format"] = formats.pop()
    columns = next((d.columns for d in detections if d.columns), {})
    values["data"]["columns"] = dict(columns)

    lines = [
        "# Hone run config written by `hone init`: the commonly edited settings at their defaults, the model "
        "and data you gave,",
        "# and the data format detected from your files. Train with `hone train "
        "THIS_FILE`. Every setting is in README.md's",
        '# "Config reference"; keys left out keep their defaults.',
        "",
    ]
    for section, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        lines.append(f"[{section}]  # {_first_sentence(cls.__doc__ or '')}")
        lines += _notes(section, model, data, detections)
        for name in COMMON.get(section, ()):
            if name not in fields:
                continue
            meta = fields[name].metadata
            comment = _first_sentence(meta.get("help", ""))
            if meta.get("choices"):
                comment += f" ({' | '.join(meta['choices'])})"
            lines += [f"# {comment}", f"{name} = {_toml_value(values[section][name])}"]
        others = [name for name in fields if name not in COMMON.get(section, ())]
        if others:
            lines.append(f"# also: {', '.join(others)}")
        lines.append("")
    return "\n".join(lines)


def _notes(section: str, model: str | None, data: list[str], detections: list[Detection]) -> list[str]:
    """Comment lines under a section header about what `hone init` found."""
    if section == "model" and not model:
        return ["# (the bundled demo model: give --model, or set name_or_path below)"]
    if section != "data":
        return []
    if not data:
        return [
            "# (the bundled demo task: give --data, or set train below; relative paths are read from the folder "
            "`hone train` runs in)"
        ]
    notes = ["# relative paths are read from the folder `hone train` runs in"]
    for d in detections:
        if d.format:
            mapped = f", with columns = {_inline(d.columns)}" if d.columns else ""
            notes.append(f"# {d.entry}: detected {d.format}{mapped} (first row's columns: {_names(d.found)})")
        else:
            notes.append(f"# {d.entry}: {d.note}")
    mappings = {tuple(sorted(d.columns.items())) for d in detections if d.format}
    if len(mappings) > 1:
        notes.append(
            "# these files need different column mappings: one run reads them all with the one below, so "
            "rename columns to match (or train on them separately)"
        )
    return notes


def _names(names: list[str], shown: int = 8) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _inline(mapping: dict[str, str]) -> str:
    from hone.core.config import _toml_value

    return _toml_value(mapping)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    return _SENTENCE_END.split(text, maxsplit=1)[0].rstrip(".") + "."


def run(args) -> int:
    from hone.core.api import resolve_source
    from hone.core.config import RunConfig, tomllib

    if args.model:
        try:  # a missing folder or .gguf, a bundled: typo; a Hub id is not looked up (no network)
            resolve_source(args.model)
        except HoneError as e:
            raise HoneError(e.message, e.advice.replace("set model.name_or_path to", "give --model")) from None
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        if out.is_dir():
            raise HoneError(f"--out {out} is a folder", "give a file name, e.g. --out run.toml")
        if out.exists() and not args.force:
            raise HoneError(f"{out} already exists", "pass --force to replace it, or choose another --out")
    detections = [d for entry in args.data for d in detect(entry)]
    text = starter_toml(args.model, args.data, detections)
    # The promise of this command: what it prints loads and passes every check (a failure here is Hone's bug).
    RunConfig.from_dict(tomllib.loads(text), source="hone init")
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}; train with: hone train {out}", file=sys.stderr)
    for d in detections:
        if not d.format:
            print(f"hone: note: {d.entry}: {d.note}", file=sys.stderr)
    return 0

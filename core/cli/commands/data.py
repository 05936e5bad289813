"""`hone data check FILE [--model M]` and `hone data inspect FILE --model M --row I`.

check:   reads every row, prints the validation report (rows kept, skipped by reason with row numbers, token
         length stats with a model); exits 1 only when no row is usable.
inspect: renders rows through the model's chat template and prints them with the trained tokens highlighted; with
         --method, as that method reads them (a pair's prompt and both answers, KTO's labelled answers, GRPO's prompt).
"""

from __future__ import annotations

import argparse
import json
import sys

from hone.core.config import DATA_FORMATS, PREFERENCE_METHODS, TRAINING_METHODS, UNPAIRED_METHODS, DataConfig
from hone.core.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "data",
        help="check a dataset or inspect its rows",
        description="Validate datasets and see rows as the model will.",
    )
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    check = sub.add_parser("check", help="print the validation report of one or more data files")
    check.add_argument("files", nargs="+", metavar="FILE", help="dataset files, folders or Hugging Face ids")
    check.add_argument(
        "--model",
        "-m",
        help="model (or tokenizer folder) whose chat template and tokenizer to "
        "use; without it only the structure is checked, no token counts",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument(
        "--method",
        choices=TRAINING_METHODS,
        default="sft",
        help="the training method the data is for: sft rows, pairs of chosen and rejected answers for dpo, simpo "
        "and orpo, answers labelled desirable or not for kto, or prompts for grpo (default sft)",
    )
    _data_options(check)

    inspect = sub.add_parser("inspect", help="show rows rendered with the chat template, trained tokens highlighted")
    inspect.add_argument("file", metavar="FILE", help="a dataset file, folder or Hugging Face id")
    inspect.add_argument("--model", "-m", required=True, help="model (or tokenizer folder)")
    inspect.add_argument(
        "--row", "-r", default="1", help="row number as the report prints it (1-based), or a range like 3-7"
    )
    inspect.add_argument(
        "--method",
        choices=TRAINING_METHODS,
        default="sft",
        help="read the rows as this training method does: sft rows (default); a pair's prompt and both answers for "
        "dpo, simpo and orpo; labelled answers for kto; the prompt the policy answers, with the columns rewards "
        "read, for grpo",
    )
    inspect.add_argument("--tokens", action="store_true", help="also list the token ids (* = trained)")
    inspect.add_argument("--no-color", action="store_true", help="mark trained text with [[...]] instead of color")
    _data_options(inspect)
    return parser


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=DATA_FORMATS, default="auto", help="row format (default: detect)")
    parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME=YOURS",
        help="map a column, e.g. --column messages=dialog (repeatable)",
    )
    parser.add_argument("--max-length", type=int, default=DataConfig().max_length, help="longest row in tokens")
    parser.add_argument("--overlong", choices=("truncate", "drop"), default="truncate")
    parser.add_argument("--train-on", choices=("assistant", "all"), default="assistant")
    parser.add_argument(
        "--chat-template",
        default="",
        metavar="NAME_OR_FILE",
        help="chat template as data.chat_template takes it: chatml or a Jinja file (default: the model's own)",
    )


def _config(args, files: list[str]) -> DataConfig:
    columns = {}
    for item in args.column:
        name, sep, yours = item.partition("=")
        if not sep or not name or not yours:
            raise ConfigError(f"--column {item!r} is not of the form NAME=YOURS", "write e.g. --column messages=dialog")
        columns[name.strip()] = yours.strip()
    return DataConfig(
        train=files,
        format=args.format,
        columns=columns,
        max_length=args.max_length,
        overlong=args.overlong,
        train_on=args.train_on,
        chat_template=args.chat_template,
    )


def load_tokenizer(name: str):
    """The tokenizer (or, for vision models, the processor) that training with model `name` would use: a model
    folder, .gguf file, `bundled:` name, Hugging Face id, or a folder holding only tokenizer files. No weights are
    read; the Studio's Data page loads it the same way (`hone.core.api.tokenizer_for`)."""
    from hone.core.api import tokenizer_for
    from hone.core.config import ModelConfig

    return tokenizer_for(ModelConfig(name_or_path=name))


def check_inputs(files: list[str], model: str | None) -> None:
    """Every file and the model exist (a Hub id: cached, or the Hub knows it), before anything loads: a mistake is
    one line, exit 2. A folder given as --model is left to `load_tokenizer`, which also takes tokenizer-only folders
    and says at once what is missing."""
    from pathlib import Path

    from hone.core.api import check_data_files, check_model
    from hone.core.config import ModelConfig

    check_data_files(
        files,
        "train",
        "check the file names (a data file, a folder, a bundled: name or a Hugging Face dataset id like org/name)",
    )
    if model and not Path(model).expanduser().is_dir():
        check_model(ModelConfig(name_or_path=model), given_as="--model")


def _tokenizer(model: str, console, template: str = ""):
    """`load_tokenizer` under a progress line (building a GGUF's tokenizer from its metadata takes a while), with
    the chat template `--chat-template` asks for."""
    from hone.core.api import apply_template_setting
    from hone.core.cli.console import Phase

    with Phase(console, f"loading the tokenizer of {model}"):
        tokenizer = load_tokenizer(model)
    said = apply_template_setting(tokenizer, template)
    if said:
        console.print(said)
    return tokenizer


def run(args) -> int:
    from rich.console import Console

    files = list(args.files) if args.data_command == "check" else [args.file]
    check_inputs(files, args.model)
    console = Console(stderr=True)  # progress on stderr: stdout is the report (or its JSON)
    if args.data_command == "check":
        return _check(args, console)
    return _inspect(args, console)


def _check(args, console) -> int:
    from hone.core.api import check_data, check_pairs, check_prompts, check_unpaired, format_report
    from hone.core.cli.console import Phase
    from hone.core.events import to_dict

    cfg = _config(args, list(args.files))
    # what the method reads from a row: preference pairs, KTO's labelled answers, GRPO's prompts, or supervised rows
    pairs = args.method in PREFERENCE_METHODS + UNPAIRED_METHODS + ("grpo",)
    check_preference = (
        check_unpaired if args.method in UNPAIRED_METHODS else check_prompts if args.method == "grpo" else check_pairs
    )
    if args.model:
        tokenizer = _tokenizer(args.model, console, cfg.chat_template)
        with Phase(console, f"tokenizing every row with the chat template of {args.model}", unit="rows") as phase:
            if pairs:
                report = check_preference(cfg, tokenizer)
            else:
                report, _ = check_data(cfg, tokenizer, progress=lambda text, done: _rows_read(phase, text))
            phase.update(report.rows_read)
    else:
        tokenizer = None
        report = check_preference(cfg) if pairs else check_data(cfg, None)[0]
    if args.json:
        print(json.dumps(to_dict(report), indent=2))
    else:
        print(format_report(report, color=sys.stdout.isatty()))
        if tokenizer is None and report.rows_kept:
            print("  (give --model to count tokens and check the chat template on every row)")
    if report.rows_kept == 0:
        print("hone: no usable row; fix the rows listed above", file=sys.stderr)
        return 1
    return 0


def _rows_read(phase, text: str) -> None:
    """check_data says "train: 1,234 rows read" while it reads (and tokenizes); pass the count on."""
    if text.endswith(" rows read"):
        count = text.rpartition(": ")[2].split(" ")[0].replace(",", "")
        if count.isdigit():
            phase.update(int(count))


def _inspect(args, console) -> int:
    from hone.core.api import (
        format_preference_view,
        format_prompt_view,
        format_view,
        inspect_preference_rows,
        inspect_prompt_rows,
        inspect_rows,
    )

    first, sep, last = args.row.partition("-")
    try:
        rows = list(range(int(first), int(last) + 1)) if sep else [int(first)]
    except ValueError:
        raise ConfigError(
            f"--row {args.row!r} is not a row number or a range like 3-7", "write e.g. --row 17"
        ) from None
    if not rows or min(rows) < 1:
        raise ConfigError(f"--row {args.row!r} has no row numbers of 1 or more", "rows are numbered from 1")
    cfg = _config(args, [args.file])
    tokenizer = _tokenizer(args.model, console, cfg.chat_template)
    if args.method == "grpo":
        views, show = inspect_prompt_rows(args.file, tokenizer, rows, cfg=cfg), format_prompt_view
    elif args.method in PREFERENCE_METHODS + UNPAIRED_METHODS:
        views = inspect_preference_rows(args.file, tokenizer, rows, cfg=cfg, method=args.method)
        show = format_preference_view
    else:
        views, show = inspect_rows(args.file, tokenizer, rows, cfg=cfg), format_view
    color = sys.stdout.isatty() and not args.no_color
    for n, view in enumerate(views):
        if n:
            print("\n" + "-" * 60)
        print(show(view, color=color, show_tokens=args.tokens))
    return 0

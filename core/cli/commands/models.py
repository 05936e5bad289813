"""`hone models search TEXT`, `hone models download ID`, `hone models login` / `logout`: find and download models
from the Hugging Face Hub into its cache (hone.core.hub), where `model.name_or_path = "ID"` finds them."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "models",
        help="search the Hugging Face Hub and download models",
        description="Search the Hugging Face Hub by name and download a model into the Hugging Face "
        "cache, where training finds it by its id. HF_ENDPOINT points at a mirror. A stopped download "
        "(Ctrl-C) continues where it stopped when run again.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    search = actions.add_parser("search", help="models whose id contains TEXT, most downloaded first")
    search.add_argument("text", metavar="TEXT", help="part of the model's id, e.g. qwen3 or smollm2")
    search.add_argument("--limit", type=int, default=20, metavar="N", help="show at most N models (default 20)")
    download = actions.add_parser("download", help="download a model into the Hugging Face cache")
    download.add_argument("repo_id", metavar="ID", help="the model's id, e.g. Qwen/Qwen3-0.6B")
    download.add_argument("--revision", default="", metavar="R", help="a branch, tag or commit (default: main)")
    download.add_argument(
        "--all-files",
        action="store_true",
        help="every file of the repo, not only what "
        "transformers needs (other frameworks' weights, ONNX, original checkpoints)",
    )
    login = actions.add_parser("login", help="keep a Hugging Face token in the OS keyring (for gated models)")
    login.add_argument("--token-stdin", action="store_true", help="read the token from standard input")
    actions.add_parser("logout", help="remove the token Hone keeps in the OS keyring")
    return p


def run(args) -> int:
    from rich.console import Console

    console = Console()
    return {"search": _search, "download": _download, "login": _login, "logout": _logout}[args.action](args, console)


def _search(args, console) -> int:
    from rich.table import Table

    from hone.core.api import search_models

    found = search_models(args.text, limit=args.limit)
    if not found:
        console.print(f"no model on the Hub has {args.text!r} in its id", highlight=False)
        return 1
    table = Table(show_edge=False, header_style="bold")
    for column in ("model", "parameters", "weights", "downloads", "likes", "license", "gated"):
        table.add_column(
            column, justify="right" if column in ("parameters", "weights", "downloads", "likes") else "left"
        )
    for model in found:
        table.add_row(
            model.id,
            human_count(model.parameters) if model.parameters else "?",
            human_size(model.weight_bytes) if model.weight_bytes else "?",
            f"{model.downloads:,}",
            f"{model.likes:,}",
            model.license or "—",
            model.gated or "no",
        )
    console.print(table)
    console.print("download one with `hone models download ID`", style="dim")
    return 0


def _download(args, console) -> int:
    import threading

    from hone.core.api import download_model, model_files
    from hone.core.cli.console import Phase

    listing = model_files(args.repo_id, args.revision)  # errors (no such model, offline) before the bar
    files = listing.files if args.all_files else listing.wanted
    total = sum(f.size for f in files)
    stop = threading.Event()
    text = f"downloading {args.repo_id} ({len(files)} files, {human_size(total)})"
    try:
        with Phase(console, text, total=max(1, round(total / 1e6)), unit="MB") as phase:
            result = download_model(
                args.repo_id,
                args.revision,
                all_files=args.all_files,
                stop=stop,
                progress=lambda p: phase.update(round(p.done / 1e6)),
            )
    except KeyboardInterrupt:
        print("hone: download stopped; run the same command again to continue where it stopped", file=sys.stderr)
        return 130
    console.print(f"{args.repo_id} is in the Hugging Face cache: {result.folder}", highlight=False, soft_wrap=True)
    revision = f' and model.revision = "{args.revision}"' if args.revision else ""
    console.print(f'train on it with model.name_or_path = "{args.repo_id}"{revision}', highlight=False)
    return 0


def _login(args, console) -> int:
    import getpass

    from hone.core.api import save_token

    token = (
        sys.stdin.readline()
        if args.token_stdin
        else getpass.getpass("Hugging Face token (from huggingface.co/settings/tokens; input hidden): ")
    )
    save_token(token)
    console.print("the token is kept in the OS keyring; Hone never writes it into a config", highlight=False)
    return 0


def _logout(args, console) -> int:
    from hone.core.api import forget_token

    console.print(
        "the token was removed from the OS keyring"
        if forget_token()
        else "Hone keeps no token in the OS keyring (HF_TOKEN and `hf auth login` are not changed)",
        highlight=False,
    )
    return 0


def human_size(n: float) -> str:
    """Bytes as people read them: 1.5 GB, 820 MB (decimal units, as the Hub shows sizes)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: float) -> str:
    """A parameter count: 135M, 7.6B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(int(n))

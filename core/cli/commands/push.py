"""`hone push EXPORT_FOLDER OWNER/NAME [--private]`: put an export on the Hugging Face Hub (hone.core.hub.push)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "push",
        help="push an export (adapter, merged model, GGUF) to the Hugging Face Hub",
        description="Upload a folder `hone export` wrote to a model repository on the Hugging Face Hub "
        "in one commit, creating the repository if needed. The export's model card (README.md) goes "
        "with it; an export without one (GGUF, Ollama) gets Hone's card first. export.json stays on "
        "this machine. Needs a token that can write: `hone models login`, or HF_TOKEN. HF_ENDPOINT "
        "points at another Hub.",
    )
    p.add_argument("folder", metavar="EXPORT_FOLDER", help="the export's folder, e.g. runs/NAME/exports/adapter")
    p.add_argument(
        "repo_id",
        metavar="OWNER/NAME",
        help="the repository: your user name (or an organization you write to) and a name, e.g. alice/my-run-adapter",
    )
    p.add_argument(
        "--private", action="store_true", help="create the repository private (an existing one keeps its visibility)"
    )
    return p


def run(args) -> int:
    from rich.console import Console

    from hone.core.api import push_folder
    from hone.core.cli.commands.models import human_size
    from hone.core.cli.console import Phase

    console = Console(stderr=True)
    try:
        with Phase(console, f"pushing {args.folder} to {args.repo_id}", total=None, unit="MB") as phase:
            result = push_folder(
                args.folder, args.repo_id, private=args.private, progress=lambda p: phase.update(round(p.done / 1e6))
            )
    except KeyboardInterrupt:
        print(
            "hone: push stopped; the files go up in one commit at the end, so the repository holds all of them or "
            "none; run the same command again (files already there unchanged are not sent twice)",
            file=sys.stderr,
        )
        return 130
    if result.card_written:
        console.print(f"wrote Hone's model card to {args.folder}/README.md", highlight=False, soft_wrap=True)
    console.print(
        f"pushed {len(result.files)} files ({human_size(result.total_bytes)}) in commit {result.commit[:12]}",
        highlight=False,
    )
    print(result.url)  # stdout holds the URL alone, for scripts
    return 0

"""Push an export to the Hugging Face Hub: create the model repository if needed and upload the export's files in
one commit, with Hone's model card.

What goes: every file of the export folder except export.json (it records folders of this machine: the run's path)
and hidden files. An export without a README.md gets Hone's card (hone.core.export.card) written into the folder
first, so what is on the Hub is what the folder holds.

huggingface_hub does the transfer (`HfApi.create_repo`, `preupload_lfs_files`, `create_commit`: present since its
0.2x releases, so the same code runs against every version Hone installs). Files are uploaded one by one before the
commit, so progress is reported and a stop is honoured between files; nothing is committed until all have arrived.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hone.core.hub.connection import HubError, check_online, endpoint, hub_errors
from hone.core.hub.token import hub_token

MANIFEST = "export.json"  # hone.core.export.formats.MANIFEST_FILE, named here so a push does not load the exporters
LOGIN_ADVICE = (
    "log in: `hone models login` (or Token… in Search the Hub) with a token that can write, or set "
    "HF_TOKEN; create one on {endpoint}/settings/tokens"
)
# A user or organization name, a slash, a repository name: letters, digits, '-', '_', '.', at most 96 characters
# (the Hub's own rule), not starting or ending with '-' or '.'.
_REPO_ID = re.compile(r"^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class PushProgress:
    """How far a push got: `stage` in words, bytes uploaded of all, the file being sent ("" between files)."""

    stage: str
    done: int
    total: int
    file: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 0.0


@dataclass(frozen=True)
class PushResult:
    """What a push did.

    Attributes:
        repo_id: OWNER/NAME.
        url: the repository's page on the Hub.
        commit: the commit's id ("" when the push was stopped before it).
        commit_url: the commit's page ("" likewise).
        files: the paths uploaded, relative to the export folder, sorted.
        total_bytes: their size together.
        private: the repository was asked for as private (an existing one keeps its visibility).
        card_written: Hone wrote README.md into the folder because the export had none.
    """

    repo_id: str
    url: str
    commit: str
    commit_url: str
    files: list[str] = field(default_factory=list)
    total_bytes: int = 0
    private: bool = False
    card_written: bool = False

    @property
    def complete(self) -> bool:
        return bool(self.commit)


def check_repo_id(repo_id: str) -> str:
    """`repo_id` stripped, or HubError when it is not OWNER/NAME as the Hub accepts it."""
    repo_id = repo_id.strip()
    if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
        raise HubError(
            f"{repo_id!r} is not a repository name the Hugging Face Hub accepts",
            "write OWNER/NAME: your user name (or an organization you can write to), a slash, and a name "
            "of letters, digits, '-', '_' or '.', e.g. alice/my-run-adapter",
            "hub-repo-id",
        )
    return repo_id


def export_kind(folder: Path) -> str:
    """What the export folder holds: "adapter", "merged" or "gguf"; HubError when it is none of Hone's exports."""
    if not folder.is_dir():
        raise HubError(
            f"{folder} is not a folder", "give the folder `hone export` wrote (RUN_DIR/exports/FORMAT)", "hub-folder"
        )
    if (folder / "adapter_config.json").is_file():
        return "adapter"
    if (folder / "config.json").is_file():
        return "merged"
    if any(folder.glob("*.gguf")):
        return "gguf"
    raise HubError(
        f"{folder} is not an export Hone made: it has no adapter_config.json, config.json or .gguf file",
        "export the run first (`hone export RUN_DIR`, or the Export page) and push the folder it wrote",
        "hub-folder",
    )


def ensure_card(folder: Path, kind: str) -> bool:
    """Write Hone's model card into `folder` when it has no README.md; True when one was written.

    The card's format, base model and run name come from the export's export.json; an export without one (a run's
    own adapter/ folder) is described from adapter_config.json and the folder's name.
    """
    from hone.core.export.card import CARD_FILE, write_model_card

    if (folder / CARD_FILE).is_file():
        return False
    manifest = _read_json(folder / MANIFEST)
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    fmt = manifest.get("format") or kind
    base = manifest.get("base_model") or _read_json(folder / "adapter_config.json").get("base_model_name_or_path", "")
    name = Path(manifest["run"]).name if manifest.get("run") else folder.name
    try:
        write_model_card(folder, fmt, base or "the base model", name, ggufs[0] if ggufs else "")
    except OSError as e:
        raise HubError(
            f"the export has no model card and Hone cannot write one into {folder} ({e.strerror or e})",
            "make the folder writable, or put a README.md in it, and push again",
            "hub-folder",
        ) from None
    return True


def files_to_push(folder: Path) -> list[Path]:
    """The export's files, sorted: everything but export.json and hidden files or folders."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def hub_user() -> str:
    """The name of the account the token belongs to (the Hub's whoami), or "" when there is no token or it cannot
    be asked (offline, a token the Hub refuses)."""
    token, _ = hub_token()
    if not token:
        return ""
    from huggingface_hub import HfApi

    try:
        return str(HfApi(endpoint=endpoint(), token=token).whoami().get("name") or "")
    except Exception:  # a default for a form field: any failure means "no default"
        return ""


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    progress: Callable[[PushProgress], None] | None = None,
    stop: threading.Event | None = None,
) -> PushResult:
    """Create OWNER/NAME on the Hub if needed and upload the export folder to it in one commit.

    Args:
        folder: an export folder (an adapter, a merged model, or a GGUF with its Modelfile); a file inside one (the
            .gguf) stands for its folder.
        repo_id: OWNER/NAME of the model repository.
        private: create the repository private (an existing repository keeps its visibility).
        progress: called with PushProgress after each step, from the pushing thread.
        stop: set it to stop between files; nothing is committed then (`PushResult.complete` is False).

    Returns:
        PushResult with the repository's URL and the commit.

    Raises:
        HubError: not OWNER/NAME, not an export, no token, a token that cannot write there (401/403), the Hub
            unreachable or switched off, or a Hub error, each with advice.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    repo_id = check_repo_id(repo_id)
    folder = Path(folder).expanduser()
    if folder.is_file() and folder.suffix == ".gguf":
        folder = folder.parent
    kind = export_kind(folder)
    check_online()
    token, source = hub_token()
    if not token:
        raise HubError(
            "Hone has no Hugging Face token, and pushing to the Hub needs one that can write",
            LOGIN_ADVICE.format(endpoint=endpoint()),
            "hub-token",
        )
    card_written = ensure_card(folder, kind)
    paths = files_to_push(folder)
    names = [p.relative_to(folder).as_posix() for p in paths]
    sizes = [p.stat().st_size for p in paths]
    total, done = sum(sizes), 0
    url = f"{endpoint()}/{repo_id}"

    def report(stage: str, file: str = "") -> None:
        if progress is not None:
            progress(PushProgress(stage, done, total, file))

    api = HfApi(endpoint=endpoint(), token=token)
    with push_errors(repo_id, source):
        report(f"creating {repo_id}")
        api.create_repo(repo_id, exist_ok=True, private=private, repo_type="model")
        operations = []
        for path, name, size in zip(paths, names, sizes, strict=True):
            if stop is not None and stop.is_set():
                return PushResult(repo_id, url, "", "", names, total, private, card_written)
            report(f"uploading {name}", name)
            operation = CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
            api.preupload_lfs_files(repo_id, additions=[operation], repo_type="model")
            operations.append(operation)
            done += size
        if stop is not None and stop.is_set():
            return PushResult(repo_id, url, "", "", names, total, private, card_written)
        report(f"committing {len(names)} files")
        commit = api.create_commit(
            repo_id, operations, commit_message=f"Upload {folder.name} from Hone Studio", repo_type="model"
        )
    report("done")
    return PushResult(repo_id, url, commit.oid, commit.commit_url, names, total, private, card_written)


@contextlib.contextmanager
def push_errors(repo_id: str, token_source: str):
    """Turn what a push meets into HubError with advice: a refused token (401), no right to write (403); the rest
    (the Hub unreachable, busy) as hone.core.hub.connection.hub_errors says it."""
    from huggingface_hub import errors

    owner = repo_id.partition("/")[0]
    with hub_errors(repo_id, with_token=True):
        try:
            yield
        except errors.HfHubHTTPError as e:
            status = getattr(getattr(e, "response", None), "status_code", 0)
            if status == 401:
                raise HubError(
                    f"the Hugging Face Hub did not accept the token from {token_source} (401: wrong, "
                    "expired or revoked)",
                    LOGIN_ADVICE.format(endpoint=endpoint()),
                    "hub-token",
                ) from None
            if status == 403:
                raise HubError(
                    f"the token from {token_source} may not write to {repo_id} (403)",
                    f"use a token with write access (a fine-grained token needs write access to "
                    f"{owner!r}), and check that {owner!r} is your user name or an organization you "
                    "belong to; " + LOGIN_ADVICE.format(endpoint=endpoint()),
                    "hub-write",
                ) from None
            raise


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}

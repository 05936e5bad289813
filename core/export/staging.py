"""The folder an export writes: staged beside its final place, locked while written, checked for room, never clobbered.

An export writes into `.<name>.partial-XXXXXXXX/<name>/` next to its output folder and renames `<name>` into place only
when everything was written, so an interrupted export leaves no half-written output. The staging folder holds the
OS lock of the process writing it (hone.core.train.run_lock: released when that process ends, even by a kill), so the
next export of the run removes staging folders whose writer is gone and leaves those another export is writing.

Room: an exporter that knows its size before writing calls `check_space`, which refuses when the disk has less free;
a disk that fills up anyway (or a file-size limit, or a quota) is an ExportError naming the folder and the size
the export needs, with the staging folder removed and nothing under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hone.core.export.formats import ExportError
from hone.core.train.run_lock import RunFolderBusy, RunLock

# Errors that mean the output cannot be written where it was asked, whatever file was being written. EFBIG: a file
# passed the process's file-size limit (ulimit -f) or the file system's largest file.
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_WRITE = (errno.EROFS, *_NO_ROOM)
# Room kept for what an exporter writes besides the weights it counts (tokenizer files, config, card, export.json):
# a large vocabulary's tokenizer.json is ~10-30 MB.
EXTRA_BYTES = 64 << 20
# mkdtemp's names: ".<output folder name>.partial-" and 8 random characters.
_STAGING_NAME = re.compile(r"\..+\.partial-[A-Za-z0-9_]{8}")
# numpy's tofile reports a short write (a full disk, a file-size limit) as an OSError without errno.
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")
# safetensors (Rust) wraps the OS error in its own exception: "... I/O error: File too large (os error 27)".
_RUST_OS_ERROR = re.compile(r"os error (\d+)")


@dataclass
class _Staging:
    out: Path
    needed: int | None = None
    removed: list[str] = field(default_factory=list)


# staging content folder -> its export; an entry lives only while `staged` runs (one per export, never shared)
_exports: dict[Path, _Staging] = {}


def human_size(size: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1000
    return f"{size:,.1f} TB"


def check_space(folder: Path, needed: int) -> None:
    """Refuse an export of about `needed` bytes (EXTRA_BYTES added here) when the disk holding `folder` (a staging
    folder from `staged`) has less free. The size is kept for the message should the disk fill up anyway.

    Raises:
        ExportError: naming the output folder, the space the export needs and the space free.
    """
    needed += EXTRA_BYTES
    staging = _exports.get(folder)
    if staging is not None:
        staging.needed = needed
    out = staging.out if staging else folder
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ExportError(
            f"not enough free space for the export to {out}: it needs about {human_size(needed)} and the disk "
            f"holding {out.parent} has {human_size(free)} free",
            "free some space on that disk, or choose an --out folder on another disk; nothing was written",
        )


def staging_notes(folder: Path) -> list[str]:
    """What `staged` did besides staging (stale staging folders it removed), in sentences for the result."""
    staging = _exports.get(folder)
    if staging is None or not staging.removed:
        return []
    removed = ", ".join(staging.removed)
    return [f"removed {len(staging.removed)} staging folder(s) left by exports that were cut short: {removed}"]


def remove_stale_staging(*folders: Path) -> list[str]:
    """Remove the staging folders in `folders` whose writer is gone (their lock is free: the process ended, or an
    older Hone wrote them without a lock); keep those another export writes now. Returns the paths removed."""
    removed = []
    for folder in dict.fromkeys(folders):
        try:
            candidates = [p for p in folder.iterdir() if _STAGING_NAME.fullmatch(p.name) and p.is_dir()]
        except OSError:
            continue  # no such folder yet, or not readable: nothing of ours to clean
        for path in candidates:
            try:
                lock = RunLock.acquire(path)
            except (RunFolderBusy, OSError):
                continue  # another export writes it now (or it cannot be told): leave it
            lock.release()
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(str(path))
    return sorted(removed)


@contextlib.contextmanager
def staged(out: Path, run_dir: Path | None = None) -> Iterator[Path]:
    """A temporary folder beside `out` that replaces `out` when the block ends without an exception.

    Stale staging folders beside `out` and in RUN_DIR/exports are removed first (`remove_stale_staging`).

    Raises:
        ExportError: the folder cannot be written (read-only, no permission, disk full, file-size limit); nothing is
            left behind.
    """
    removed = remove_stale_staging(out.parent, *((run_dir / "exports",) if run_dir else ()))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        holder = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as e:
        raise _write_error(out, e, None) from None
    staging = _Staging(out, removed=removed)
    try:
        lock = RunLock.acquire(holder)  # released when this process ends, however it ends
        folder = holder / out.name
        folder.mkdir()
    except OSError as e:
        shutil.rmtree(holder, ignore_errors=True)
        raise _write_error(out, e, None) from None
    _exports[folder] = staging
    try:
        yield folder
        _put_in_place(folder, out)
    except BaseException as e:
        error = _as_write_error(e, out, holder, staging.needed)  # before the removal: it reads the files' sizes
        shutil.rmtree(holder, ignore_errors=True)
        if error is not None:
            raise error from None
        raise
    finally:
        _exports.pop(folder, None)
        lock.release()
        shutil.rmtree(holder, ignore_errors=True)


def _put_in_place(folder: Path, out: Path) -> None:
    _apply_umask(folder)
    if out.exists():
        shutil.rmtree(out)  # output_folder() allowed this: forced, and an earlier export wrote it
    os.replace(folder, out)


def _as_write_error(e: BaseException, out: Path, holder: Path, needed: int | None) -> ExportError | None:
    """The ExportError for an exception met while writing the export, or None when it is no write failure."""
    if isinstance(e, OSError):
        if e.errno is None and _SHORT_WRITE.search(str(e)):
            code = _short_write_errno(holder)
            e = OSError(code, os.strerror(code))
        denied = e.errno in (errno.EACCES, errno.EPERM)
        writing = e.errno in _NO_WRITE or (
            denied and e.filename is not None and Path(e.filename).is_relative_to(holder)
        )
        return _write_error(out, e, needed) if writing else None
    found = _RUST_OS_ERROR.search(str(e)) if type(e).__name__ == "SafetensorError" else None
    if found and int(found.group(1)) in _NO_WRITE:
        code = int(found.group(1))
        return _write_error(out, OSError(code, os.strerror(code)), needed)
    return None


def _short_write_errno(holder: Path) -> int:
    """EFBIG when a file in `holder` reached the process's file-size limit, else ENOSPC (a short write says neither)."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):  # no resource module on Windows
        return errno.ENOSPC
    if limit != resource.RLIM_INFINITY and any(p.is_file() and p.stat().st_size >= limit for p in holder.rglob("*")):
        return errno.EFBIG
    return errno.ENOSPC


def _write_error(out: Path, e: OSError, needed: int | None) -> ExportError:
    """The ExportError for an OSError met while writing the export to `out`."""
    where = e.filename or out.parent
    if e.errno in _NO_ROOM:
        size = f"about {human_size(needed)}" if needed else "more than there was room for"
        lead = (
            "a file passed this process's file-size limit (`ulimit -f`) or the file system's largest file"
            if e.errno == errno.EFBIG
            else "the disk is full (or over quota)"
        )
        return ExportError(
            f"{lead} while writing the export to {out} ({where}); the export needs {size}, and the disk holding "
            f"{out.parent} has {_free(out.parent)} free",
            "free some space, or choose an --out folder on another disk; nothing was left behind",
        )
    if e.errno == errno.EROFS:
        return ExportError(
            f"cannot write the export to {out}: {where} is on a read-only file system",
            "choose an --out folder on a writable disk",
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        return ExportError(
            f"cannot write the export to {out}: no permission to write {where}",
            "choose an --out folder you can write to (or make that folder writable)",
        )
    return ExportError(f"cannot write the export to {out}: {e.strerror or e} ({where})", "choose another --out folder")


def _free(folder: Path) -> str:
    try:
        return human_size(shutil.disk_usage(folder).free)
    except OSError:
        return "an unknown amount"


def _apply_umask(root: Path) -> None:
    """Give `root` and everything in it the modes a plain mkdir / open would (mkstemp makes files private: 0600), so
    an export is shared like any other folder the user creates."""
    mask = os.umask(0)
    os.umask(mask)
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)

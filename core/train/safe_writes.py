"""Writes that leave a whole file or the one before: JSON renamed into place, append-only files of whole lines,
and the error that says the disk is full.

Every JSON file a run folder holds is strict JSON: a number that is not finite (a loss that became NaN) is written
as null (`json_safe`). Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from pathlib import Path

from hone.core.errors import HoneError

# A write that fails with one of these ran out of room: the disk is full (ENOSPC), a quota is used up (EDQUOT), or
# a file reached the size the file system or a limit allows (EFBIG).
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _DISK_FULL


def disk_full_error(error: OSError, what: str, run_dir: Path) -> HoneError:
    """The HoneError for a write of `what` that found no room: the disk, the file, and what to do."""
    where = f" ({error.filename})" if error.filename else ""
    return HoneError(
        f"the disk is full: {what} could not be written in {run_dir}{where}: {error.strerror}",
        f"free space on the disk holding {run_dir}, then `hone train --resume {run_dir}` goes on from "
        "the last checkpoint",
    )


def json_safe(data):
    """`data` with every float that is not finite replaced by None, so json.dumps(allow_nan=False) can write it."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def replace_with(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk and rename it over `path`; on an error the
    temporary file is removed and `path` is as it was."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data) -> None:
    """Write `data` as strict JSON to a temporary file, flush it to disk, rename it over `path`. When the disk is too
    full for the temporary file, `path` is overwritten in place instead (a small file keeps its blocks), so run.json
    can still say the run failed."""
    text = json.dumps(json_safe(data), indent=2, allow_nan=False).encode("utf-8")
    try:
        replace_with(path, text)
    except OSError as e:
        if not (is_disk_full(e) and path.is_file()):
            raise
        try:
            with open(path, "r+b") as f:
                f.write(text)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            raise e from None


class LineFile:
    """An append-only file of lines, each written whole or not at all: a write that fails (a full disk) is cut back
    to the last whole line, and a partial last line left by a killed process is cut when the file is opened."""

    def __init__(self, path: Path, *, cut_partial: bool):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        self.size = os.fstat(self.fd).st_size
        if cut_partial and self.size:
            whole = whole_lines_size(path, self.size)
            if whole < self.size:
                os.ftruncate(self.fd, whole)
                self.size = whole

    def append(self, text: str) -> None:
        data, done = text.encode("utf-8"), 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            raise
        self.size += len(data)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)


def whole_lines_size(path: Path, size: int) -> int:
    """Bytes of `path` up to and with its last newline (0 when it has none)."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - (1 << 16))
            f.seek(start)
            chunk = f.read(end - start)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0

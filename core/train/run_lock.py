"""One process at a time in a run folder: an operating-system lock on RUN_DIR/run.lock, held for the whole run.

The lock is the OS's own (`fcntl.flock` on POSIX, `msvcrt.locking` on Windows), so it ends with the process that
holds it: a lock file left behind by a killed run never blocks the next one. While held, the file says who holds it
(pid, host, since when, and the file that pauses it where it has one), which is what a second process tells its user.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

from hone.core.control import PAUSE_FILE_ENV
from hone.core.errors import HoneError

LOCK_FILE = "run.lock"
# Windows locks byte ranges, and a locked range cannot be read by others: lock one byte far past the holder's note,
# so a second process can still read who holds the folder.
_WINDOWS_LOCK_OFFSET = 1 << 20
# File systems that cannot lock (some network shares) answer with these: the run goes on unlocked, as before locks.
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


class RunFolderBusy(HoneError):
    """Another process trains in this run folder."""


def _try_lock(fd: int) -> bool:
    """Take the lock without waiting; False when another process holds it."""
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EDEADLK):
                return False
            raise
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)


def read_holder(run_dir: str | Path) -> dict:
    """What run.lock says about the process holding it: {"pid", "host", "since"}; {} when there is no note (never
    locked, or released) or it cannot be read. A killed holder's note stays."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8")
        return json.loads(text.split("\n", 1)[0])
    except (OSError, ValueError):
        return {}


def describe_holder(holder: dict) -> str:
    """'pid 123 on host "box" since 2025-01-02 03:04:05' from what read_holder returns."""
    if not holder:
        return "another process (it has not said which yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')!r} since {since}"


def in_use(run_dir: str | Path) -> bool | None:
    """Whether the process holding `run_dir`'s lock is alive: its note is there (a release clears it) and names a
    live process; None when this computer cannot say (the holder ran on another host). Read from the note only: the
    lock itself is never tried, so a run starting in another process meanwhile is not told the folder is busy. A
    reused process id reads as alive, which errs on the side of "running"."""
    holder = read_holder(run_dir)
    if not holder:
        return False  # no lock file (no run of a version with locks), or one its last holder cleared on release
    pid = holder.get("pid")
    if not isinstance(pid, int) or holder.get("host") != socket.gethostname():
        return None
    return _alive(pid)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name == "nt":
        import ctypes

        kernel32 = ctypes.windll.kernel32
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        try:
            code = ctypes.c_ulong()
            return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has ended but not been reaped yet (Linux): a killed run whose parent died with it can stay
    one for a while, and signal 0 still finds it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False  # no /proc (macOS), or the process is gone since
    return stat[stat.rfind(b")") + 2 :][:1] in (b"Z", b"X")  # the state follows the command name in parentheses


def _clear_note(fd: int) -> None:
    """Empty the holder's note; where the system refuses to shorten a file with a locked range, blank it instead
    (read_holder reads blanks as no note)."""
    try:
        os.ftruncate(fd, 0)
    except OSError:
        size = min(os.fstat(fd).st_size, _WINDOWS_LOCK_OFFSET)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b" " * size)


def _busy(run_dir: Path) -> RunFolderBusy:
    return RunFolderBusy(
        f"the run folder {run_dir} is in use: {describe_holder(read_holder(run_dir))} is training in it",
        "wait for that run to end or stop it (Ctrl-C in its terminal, Stop in Hone Studio), then try again; "
        "to train alongside it, start a new run instead",
    )


def refuse_if_in_use(run_dir: str | Path) -> None:
    """Raise RunFolderBusy when another process on this computer trains in `run_dir`, before a resume reads the
    folder's checkpoints; `RunLock.acquire` still decides once the run opens the folder. Among a run's processes
    under torchrun, process 0 alone checks (and locks): the others would find it holding the folder already."""
    if "WORLD_SIZE" in os.environ and os.environ.get("RANK", "0") != "0":
        return
    if in_use(run_dir) is True and read_holder(run_dir).get("pid") != os.getpid():
        raise _busy(Path(run_dir))


class RunLock:
    """The lock on one run folder. `RunLock.acquire(run_dir)` takes it or raises RunFolderBusy; `release()` gives
    it back (closing the process gives it back too)."""

    def __init__(self, run_dir: Path, fd: int | None):
        self.run_dir = run_dir
        self._fd = fd  # None: the file system cannot lock, the run goes on unlocked

    @property
    def held(self) -> bool:
        return self._fd is not None

    @classmethod
    def acquire(cls, run_dir: str | Path) -> RunLock:
        """Lock `run_dir` (which must exist) for this process, at once or not at all.

        Raises:
            RunFolderBusy: another process holds it; the message says which (pid, host, since when).
        """
        run_dir = Path(run_dir)
        path = run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes (PEP 446)
        try:
            locked = _try_lock(fd)
        except OSError as e:
            os.close(fd)
            if e.errno in _NO_LOCKS:
                return cls(run_dir, None)
            raise
        if not locked:
            os.close(fd)
            raise _busy(run_dir)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        if os.environ.get(PAUSE_FILE_ENV, "").strip():  # the file that pauses this run (hone.core.train.run_requests)
            holder["pause_file"] = os.environ[PAUSE_FILE_ENV].strip()
        note = json.dumps(holder) + "\n"
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, note.encode("utf-8"))
        except OSError:
            pass  # a full disk: the lock holds all the same, only the note of who holds it is missing
        return cls(run_dir, fd)

    def release(self) -> None:
        """Give the lock back and clear the holder's note (the file stays: a lock file without a lock blocks nobody;
        a note left by a killed holder names a process that is gone, which `in_use` checks)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            with contextlib.suppress(OSError):
                _clear_note(fd)
            _unlock(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

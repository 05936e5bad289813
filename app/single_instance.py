"""One Hone Studio per user: a second window would start a second run on the same GPU without a word, and two
windows write the same settings. The first start holds a lock file in the user's runtime folder; a later start
finds it held, says so, and quits unless the user opens it anyway. A lock whose process died (a crash, a kill) is
stale and taken over: QLockFile checks whether the process that wrote it still runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QLockFile, QStandardPaths

LOCK_NAME = "hone-studio.lock"
# How long a start waits for the lock: long enough for a Studio that is closing to let it go.
WAIT_MS = 200


def lock_path() -> Path:
    """The lock file: in the user's runtime folder ($XDG_RUNTIME_DIR on Linux), else their config folder."""
    folder = QStandardPaths.writableLocation(QStandardPaths.RuntimeLocation) or QStandardPaths.writableLocation(
        QStandardPaths.AppConfigLocation
    )
    return Path(folder) / LOCK_NAME


class InstanceLock:
    """The lock file at `path` (default `lock_path()`): `acquire` it, ask who `holder` is, `release` it."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else lock_path()
        self._lock = QLockFile(str(self.path))
        # Never stale by age (a Studio may stay open for weeks); only when its process is gone.
        self._lock.setStaleLockTime(0)

    def acquire(self) -> bool:
        """Take the lock (taking over a stale one); False while a running process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self._lock.tryLock(WAIT_MS)

    def held(self) -> bool:
        return self._lock.isLocked()

    def holder(self) -> int | None:
        """The process id that holds the lock, where the file says (None: unheld or unreadable)."""
        info = self._lock.getLockInfo()  # PySide6: (pid, hostname, appname), or False where none could be read
        pid = info[0] if isinstance(info, tuple) and info else 0
        return int(pid) if isinstance(pid, int) and pid > 0 else None

    def release(self) -> None:
        self._lock.unlock()


def claim_instance(path: str | Path | None = None, ask: Callable[[str], bool] | None = None) -> InstanceLock | None:
    """Hold the one-Studio lock, or, where another Studio holds it, `ask` the user (default: a dialog) whether to
    open anyway.

    Returns:
        The lock (held, or not held when the user chose to open anyway): keep it as long as the window is open.
        None: another Studio is open and the user chose not to open a second one (the caller quits).
    """
    lock = InstanceLock(path)
    if lock.acquire():
        return lock
    pid = lock.holder()
    where = f" (process {pid})" if pid else ""
    text = (
        f"Hone Studio is already open{where}. A second window could start a second run on the same GPU, and both "
        "would run slowly or out of memory. Switch to the open window, or open another one anyway?"
    )
    return lock if (ask or _ask_dialog)(text) else None


def _ask_dialog(text: str) -> bool:
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Information, "Hone Studio", text)
    anyway = box.addButton("Open anyway", QMessageBox.AcceptRole)
    box.setDefaultButton(box.addButton("Quit", QMessageBox.RejectRole))
    box.exec()
    return box.clickedButton() is anyway

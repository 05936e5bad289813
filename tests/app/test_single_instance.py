"""One Hone Studio per user: a second start finds the first one's lock and says "Hone Studio is already open" (and
quits unless the user opens it anyway); a lock left by a process that died is taken over."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hone.app.single_instance import InstanceLock, claim_instance, lock_path


def test_a_second_lock_on_the_same_file_is_refused_until_the_first_is_released(qtbot, tmp_path):
    path = tmp_path / "studio.lock"
    first, second = InstanceLock(path), InstanceLock(path)
    assert first.acquire()
    assert not second.acquire(), "the file is held by a live process (this one)"
    assert second.holder() == os.getpid()
    first.release()
    assert second.acquire(), "released: the next start gets it"
    second.release()


def test_a_lock_left_by_a_dead_process_is_taken_over(qtbot, tmp_path):
    path = tmp_path / "studio.lock"
    script = textwrap.dedent(
        f"""
        import os
        from PySide6.QtCore import QLockFile
        lock = QLockFile({str(path)!r})
        assert lock.tryLock(0)
        print(os.getpid(), flush=True)
        os._exit(0)  # dies holding it: the file stays behind, as after a crash or a kill
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    dead = int(done.stdout.split()[0])
    assert path.exists() and path.read_text().split()[0] == str(dead), "the dead process's lock is on disk"
    lock = InstanceLock(path)
    assert lock.acquire(), "stale: its process is gone"
    assert path.read_text().split()[0] == str(os.getpid())
    lock.release()


@pytest.mark.parametrize("open_anyway", [False, True])
def test_a_second_studio_asks_and_quits_or_opens_anyway(qtbot, tmp_path, open_anyway):
    path = tmp_path / "studio.lock"
    first = claim_instance(path, ask=lambda text: pytest.fail(f"the first start asked: {text}"))
    assert first is not None and first.held()
    asked = []

    def ask(text: str) -> bool:
        asked.append(text)
        return open_anyway

    second = claim_instance(path, ask=ask)
    assert len(asked) == 1 and asked[0].startswith("Hone Studio is already open")
    assert f"process {os.getpid()}" in asked[0]
    if open_anyway:
        assert second is not None and not second.held(), "opened anyway, without the lock"
    else:
        assert second is None, "the caller quits"
    first.release()
    third = claim_instance(path, ask=lambda text: pytest.fail(f"asked after the first closed: {text}"))
    assert third is not None and third.held()
    third.release()


def test_the_lock_lives_in_the_users_runtime_or_config_folder(qtbot):
    from PySide6.QtCore import QStandardPaths

    folders = [
        QStandardPaths.writableLocation(QStandardPaths.RuntimeLocation),
        QStandardPaths.writableLocation(QStandardPaths.AppConfigLocation),
    ]
    path = lock_path()
    assert path.name == "hone-studio.lock" and str(path.parent) in [f for f in folders if f]


def test_hone_studio_quits_when_another_is_open_and_the_user_says_quit(qtbot, tmp_path, monkeypatch):
    import argparse

    from hone.app import main, single_instance

    path = tmp_path / "studio.lock"
    monkeypatch.setattr(single_instance, "lock_path", lambda: path)
    asked = []
    monkeypatch.setattr(single_instance, "_ask_dialog", lambda text: asked.append(text) or False)
    built = []
    monkeypatch.setattr("hone.app.window.MainWindow", lambda *a, **k: built.append(a) or pytest.fail("window built"))
    first = InstanceLock(path)
    assert first.acquire()
    args = argparse.Namespace(screenshot=None, page=None, size=None, theme=None, model=None, data=None, run=None)
    assert main.run(args) == 0
    assert len(asked) == 1 and asked[0].startswith("Hone Studio is already open") and not built
    first.release()

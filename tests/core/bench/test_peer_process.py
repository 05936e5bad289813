"""The peer's own process (core/bench/peer_process.py): a child that ends without an answer is reported in words,
with the signal that ended it and, for SIGKILL, its peak resident memory beside the host's RAM."""

from __future__ import annotations

import signal
import sys

import pytest

from hone.core.bench.peer_process import PeerFailed, _exit_words, _last_lines, run_child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL, and the peak read from /proc")
def test_a_child_killed_by_sigkill_says_so_with_its_peak_memory():
    with pytest.raises(PeerFailed) as failed:
        run_child("tests.helpers.killed_child", {}, who="stand-in", timeout_s=60)
    said = str(failed.value)
    assert said.startswith("the stand-in process was killed by SIGKILL at a peak of ")
    peak = float(said.split("at a peak of ")[1].split(" GiB")[0])
    assert 0.25 <= peak < 1  # it touched 256 MiB (the parent's own memory, copied at the fork, is not counted)
    assert "GiB of RAM" in said and "out-of-memory killer" in said
    assert said.endswith("its last lines: patched 36 layers")  # the progress bar left out


def test_exit_words_for_an_error_exit_and_other_signals():
    assert _exit_words("peer", 1, None, "boom") == "the peer process exited with 1: boom"
    said = _exit_words("peer", -signal.SIGTERM, None, "x")
    assert said == "the peer process was killed by SIGTERM; its last lines: x"
    assert "killed by signal 99" in _exit_words("peer", -99, None, "")


def test_last_lines_leave_progress_bars_out():
    output = "start\rLoading: 50%|## | 1/2 [00:01<00:01, 1.00it/s]\rLoading: 100%|###| 2/2 [00:02, 1.00it/s]\ndone\n"
    assert _last_lines(output) == "start | done"


def test_an_interrupted_parent_takes_the_child_with_it(monkeypatch):
    """Ctrl-C while the peer trains: the child is killed and reaped, not left holding the GPU."""
    import subprocess

    children = []
    real_wait = subprocess.Popen.wait

    def interrupted(self, timeout=None):
        if timeout is not None:  # the parent's watch, not the reaping after the kill
            children.append(self)
            raise KeyboardInterrupt
        return real_wait(self)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_child("tests.helpers.killed_child", {}, who="stand-in", timeout_s=60)
    assert children and children[0].returncode is not None  # killed and reaped

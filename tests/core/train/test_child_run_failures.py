"""A child run that fails before its first step reaches the Studio's follower as a RunFailed with the child's own
reason and advice, never "exit code 1", and leaves no run folder behind.

Such a child writes its RunFailed to the run folder and then removes the folder (it made it, nothing was trained),
usually before the follower's next look (every POLL_S); a child refused before the run writes no event at all. The
follower then reads the failure from the child's error output, which it holds whole."""

from __future__ import annotations

import json
import os

import pytest

from hone.core import events
from hone.core.control import RunControl
from hone.core.train import child_run

pytestmark = pytest.mark.skipif(os.name != "posix", reason="a run in a child process needs POSIX signals")


def _bad_rows(folder):
    """A JSONL file none of whose rows has a known format, at a path longer than the 80 columns a console wraps at."""
    deep = folder / ("a-folder-with-a-long-name-" * 3) / "and-another-one-below-it"
    deep.mkdir(parents=True)
    path = deep / "rows-without-a-known-format.jsonl"
    path.write_text("".join(json.dumps({"foo": i}) + "\n" for i in range(5)))
    return path


def test_a_run_that_fails_before_its_first_step_says_why(tiny_model_dir, chat_files, tiny_config, tmp_path):
    bad = _bad_rows(tmp_path)
    runs = tmp_path / "runs"
    config = tiny_config(tiny_model_dir("tiny-dense"), (bad, chat_files[1]), runs)
    seen = list(child_run.train_in_child(config, RunControl()))
    failed = seen[-1]
    assert isinstance(failed, events.RunFailed), seen
    assert sum(isinstance(e, events.RunFailed) for e in seen) == 1
    assert failed.reason.startswith("none of the 5 training rows in "), failed.reason
    assert str(bad) in failed.reason, "the path comes whole, not cut where a console wraps"
    assert "exit code" not in failed.reason
    assert "hone data check" in failed.advice and "Resume on the Runs page" not in failed.advice, failed.advice
    assert not failed.interrupted
    assert os.listdir(runs) == [], "no run folder (and no config beside it) is left behind"


def test_a_refused_run_says_why_and_leaves_no_folder(tiny_model_dir, chat_files, tiny_config, tmp_path):
    """`hone train` checks its inputs before it writes anything (exit 2): the folder made for it is removed."""
    runs = tmp_path / "runs"
    missing = tmp_path / "gone.jsonl"
    config = tiny_config(tiny_model_dir("tiny-dense"), (missing, chat_files[1]), runs)
    seen = list(child_run.train_in_child(config, RunControl()))
    assert len(seen) == 1 and isinstance(seen[0], events.RunFailed), seen
    assert str(missing) in seen[0].reason and "does not exist" in seen[0].reason, seen[0].reason
    assert "data.train" in seen[0].advice, seen[0].advice
    assert os.listdir(runs) == []


def test_the_printed_failure_is_read_back_in_its_own_words():
    said = (
        "memory: a step needs 0.3 GiB\n"
        "failed: none of the 5 training rows in /data/x.jsonl is usable\n"
        "advice: run `hone data check FILE --model MODEL`, fix the rows it lists\n"
    )
    event = child_run.unread_failure({}, said, 1)
    assert (event.reason, event.advice) == (
        "none of the 5 training rows in /data/x.jsonl is usable",
        "run `hone data check FILE --model MODEL`, fix the rows it lists",
    )
    assert event.details == said and not event.interrupted
    interrupted = child_run.unread_failure({}, "interrupted: the GPU stopped working\nadvice: resume it\n", 1)
    assert interrupted.interrupted and interrupted.reason == "the GPU stopped working"


def test_the_failure_file_wins_and_keeps_its_code():
    recorded = {"message": "the training data changed", "advice": "choose how to go on", "code": "data-changed"}
    event = child_run.unread_failure(recorded, "hone: error: the training data changed\n", 2)
    assert (event.reason, event.advice, event.code) == tuple(recorded.values())


def test_a_child_that_said_nothing_is_told_by_its_exit_code():
    event = child_run.unread_failure({"message": 3}, "Killed\n", -9)  # a failure file with a field of another type
    assert event.reason == "the training process ended without finishing (exit code -9)"
    assert "see the messages below" in event.advice and event.code == ""
